//! Raw quinn between two processes, with the transport settings replication uses
//! (`server::quic::QuicPeer`): the ceiling a follower link can reach on the host running the
//! bench.
//!
//! `cargo bench -p strata-node --bench quic` re-runs itself as the server process, then moves
//! bytes two ways for a few seconds each:
//! - fetch-shaped: a small request on a new stream, an 8 MiB answer, one at a time (what a
//!   caught-up follower of one partition does, minus the log);
//! - streaming: one stream written as fast as the connection goes (the upper bound);
//! - small round trips (a caught-up follower under `acks=all`: a small request, an answer of
//!   [`SMALL_ANSWER_BYTES`], one at a time), on a new stream each and on one long-lived stream,
//!   with the CPU time both processes spent per round trip.
//!
//! Compare the fetch-shaped figure with `scripts/bench-replication.sh`'s follower catch-up.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_node::server::quic::QuicPeer;

const ANSWER_BYTES: usize = 8 << 20;
/// A follower's answer at moderate `acks=all` load (the median at 188,000 records/s, RF 3).
const SMALL_ANSWER_BYTES: usize = 53 << 10;
/// A small request's frame on the long-lived stream: a length prefix and a body.
const SMALL_REQUEST_BYTES: usize = 64;
const RUN: Duration = Duration::from_secs(4);

fn main() {
    if let Ok(addr) = std::env::var("STRATA_QUIC_BENCH_SERVE") {
        serve(addr.parse().expect("an address"));
        return;
    }
    let port = 20_000 + (std::process::id() % 10_000) as u16;
    let server_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut server = std::process::Command::new(std::env::current_exe().unwrap())
        .env("STRATA_QUIC_BENCH_SERVE", server_addr.to_string())
        .spawn()
        .expect("spawn the server process");
    std::thread::sleep(Duration::from_millis(500));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = QuicPeer::bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let connection = client
            .endpoint()
            .connect_with(client_config(&client), server_addr, "strata-node")
            .unwrap()
            .await
            .expect("connect");
        // Fetch-shaped.
        let started = Instant::now();
        let mut moved = 0usize;
        while started.elapsed() < RUN {
            moved += ask(&connection, b"fetch", ANSWER_BYTES).await.len();
        }
        let fetch_rate = moved as f64 / started.elapsed().as_secs_f64();
        // Streaming.
        let (mut send, mut receive) = connection.open_bi().await.unwrap();
        send.write_all(b"stream").await.unwrap();
        send.finish().unwrap();
        let started = Instant::now();
        let mut moved = 0usize;
        let mut buffer = vec![0u8; 1 << 20];
        while started.elapsed() < RUN {
            match receive.read(&mut buffer).await.unwrap() {
                Some(n) => moved += n,
                None => break,
            }
        }
        let stream_rate = moved as f64 / started.elapsed().as_secs_f64();
        drop(receive);
        // Small round trips, a new stream each.
        let cpu = CpuClock::new(server.id());
        let started = Instant::now();
        let mut trips = 0u64;
        while started.elapsed() < RUN {
            let answer = ask(&connection, b"small", SMALL_ANSWER_BYTES).await;
            assert_eq!(answer.len(), SMALL_ANSWER_BYTES);
            trips += 1;
        }
        let per_stream = (trips as f64 / started.elapsed().as_secs_f64(), cpu.per(trips));
        // Small round trips on one stream: length-prefixed frames each way.
        let cpu = CpuClock::new(server.id());
        let (mut send, mut receive) = connection.open_bi().await.unwrap();
        send.write_all(b"framed").await.unwrap();
        let request = [1u8; SMALL_REQUEST_BYTES];
        let mut answer = vec![0u8; SMALL_ANSWER_BYTES];
        let started = Instant::now();
        let mut trips = 0u64;
        while started.elapsed() < RUN {
            send.write_all(&request).await.unwrap();
            receive.read_exact(&mut answer).await.unwrap();
            trips += 1;
        }
        let one_stream = (trips as f64 / started.elapsed().as_secs_f64(), cpu.per(trips));
        send.finish().unwrap();
        println!(
            "small round trips ({} KiB answers, one at a time): a new stream each {:.0}/s, {:.0} µs of CPU each (both processes); one stream {:.0}/s, {:.0} µs each",
            SMALL_ANSWER_BYTES >> 10,
            per_stream.0,
            per_stream.1,
            one_stream.0,
            one_stream.1
        );
        let path = connection.stats().path;
        println!(
            "raw quinn, two processes on loopback: fetch-shaped (8 MiB answers, one at a time) {:.0} MB/s; one stream {:.0} MB/s (path MTU {}, {} packets lost)",
            fetch_rate / 1e6,
            stream_rate / 1e6,
            path.current_mtu,
            path.lost_packets
        );
    });
    let _ = server.kill();
    let _ = server.wait();
}

/// One request on a stream of its own (`kind` names the answer the server sends), and its whole
/// answer, as a replication fetch travels.
async fn ask(connection: &quinn::Connection, kind: &[u8], answer_bytes: usize) -> Vec<u8> {
    let (mut send, mut receive) = connection.open_bi().await.unwrap();
    send.write_all(kind).await.unwrap();
    send.finish().unwrap();
    receive.read_to_end(answer_bytes + 1024).await.unwrap()
}

/// The replication client settings (self-signed, any certificate) for a raw connection.
fn client_config(peer: &QuicPeer) -> quinn::ClientConfig {
    peer.client_config().clone()
}

fn serve(addr: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let peer = QuicPeer::bind(addr, None).unwrap();
        let answer = Bytes::from(vec![7u8; ANSWER_BYTES]);
        let incoming = peer.endpoint().accept().await.expect("a client");
        let connection = incoming.await.unwrap();
        let small = Bytes::from(vec![7u8; SMALL_ANSWER_BYTES]);
        while let Ok((mut send, mut receive)) = connection.accept_bi().await {
            let mut kind = [0u8; 5];
            receive.read_exact(&mut kind).await.unwrap();
            match &kind {
                b"strea" => {
                    let chunk = Bytes::from(vec![7u8; 1 << 20]);
                    tokio::task::spawn_local(async move {
                        while send.write_chunk(chunk.clone()).await.is_ok() {}
                    });
                }
                b"frame" => {
                    let small = small.clone();
                    tokio::task::spawn_local(async move {
                        let mut rest = [0u8; 1];
                        receive.read_exact(&mut rest).await.unwrap();
                        let mut request = [0u8; SMALL_REQUEST_BYTES];
                        while receive.read_exact(&mut request).await.is_ok() {
                            if send.write_chunk(small.clone()).await.is_err() {
                                return;
                            }
                        }
                    });
                }
                b"small" => {
                    let _ = send.write_chunk(small.clone()).await;
                    let _ = send.finish();
                }
                _ => {
                    let _ = send.write_chunk(answer.clone()).await;
                    let _ = send.finish();
                }
            }
        }
    });
}

/// CPU time (user + system) of this process and the server process since `new`.
struct CpuClock {
    server: u32,
    started: f64,
}

impl CpuClock {
    fn new(server: u32) -> CpuClock {
        CpuClock {
            server,
            started: Self::seconds(server),
        }
    }

    /// Microseconds of CPU per round trip since `new`.
    fn per(&self, trips: u64) -> f64 {
        (Self::seconds(self.server) - self.started) * 1e6 / trips.max(1) as f64
    }

    fn seconds(server: u32) -> f64 {
        let ticks = |pid: &str| -> f64 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command name (which may hold spaces): utime and stime are the
            // 12th and 13th of them.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let fields: Vec<&str> = after.split_whitespace().collect();
            let field = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            field(11) + field(12)
        };
        // SAFETY: sysconf with a valid name has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (ticks("self") + ticks(&server.to_string())) / hz
    }
}
