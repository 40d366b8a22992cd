//! Raw quinn between two processes, with the transport settings replication uses
//! (`server::quic::QuicPeer`): the ceiling a follower link can reach on this machine.
//!
//! `cargo bench -p strata-node --bench quic` re-runs itself as the server process, then moves
//! bytes two ways for a few seconds each:
//! - fetch-shaped: a small request on a new stream, an 8 MiB answer, one at a time (what a
//!   caught-up follower of one partition does, minus the log);
//! - streaming: one stream written as fast as the connection goes (the upper bound).
//!
//! Compare the fetch-shaped figure with `scripts/bench-replication.sh`'s follower catch-up.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_node::server::quic::QuicPeer;

const ANSWER_BYTES: usize = 8 << 20;
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
            let (mut send, mut receive) = connection.open_bi().await.unwrap();
            send.write_all(b"fetch").await.unwrap();
            send.finish().unwrap();
            let answer = receive.read_to_end(ANSWER_BYTES + 1024).await.unwrap();
            moved += answer.len();
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

/// The replication client settings (self-signed, any certificate) for a raw connection.
fn client_config(peer: &QuicPeer) -> quinn::ClientConfig {
    peer.client_config().clone()
}

fn serve(addr: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let peer = QuicPeer::bind(addr, None).unwrap();
        let answer = Bytes::from(vec![7u8; ANSWER_BYTES]);
        let incoming = peer.endpoint().accept().await.expect("a client");
        let connection = incoming.await.unwrap();
        while let Ok((mut send, mut receive)) = connection.accept_bi().await {
            let request = receive.read_to_end(64).await.unwrap();
            if request == b"stream" {
                let chunk = Bytes::from(vec![7u8; 1 << 20]);
                while send.write_chunk(chunk.clone()).await.is_ok() {}
                return;
            }
            let _ = send.write_chunk(answer.clone()).await;
            let _ = send.finish();
        }
    });
}
