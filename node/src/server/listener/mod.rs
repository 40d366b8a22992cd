//! Listeners and connections: frames in, requests dispatched concurrently, responses out.
//!
//! One connection driver ([`drive`]) serves both TCP protocols, the native one
//! ([`native`]) and Kafka's ([`kafka`]); a [`Protocol`] says how its frames decode, how a
//! request is answered and in which order answers leave. The driver reads frames one after
//! another and starts each request as its own task, so requests are pipelined; a bounded
//! number per connection are in flight, past it the reader waits. One writer task per
//! connection sends the answers, every answer already waiting in the same vectored write, and
//! records that live in segment files with `sendfile`.
//!
//! Bad input never takes the node down: an oversized frame is refused and the connection
//! closed (its body is never read, never allocated); what a protocol cannot decode is answered
//! or closes the connection, as that protocol says; a handler that panics costs its request
//! only; a broken socket ends that connection only. Each is logged with why.
//!
//! Replication has a listener of its own ([`replication`]): QUIC, one stream per request.
//! The admin HTTP endpoint ([`admin`]) runs on the control side, not on a shard.

pub(super) mod admin;
pub(super) mod kafka;
pub(super) mod native;
pub(super) mod replication;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::BytesMut;
use futures_util::FutureExt;
use strata_wire::protocol::FrameParts;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::log::FileRegion;
use crate::server::shard::Shard;

/// Starts every listener a shard serves: the shared client port (SO_REUSEPORT, every
/// shard), this shard's own port, the Kafka address when one is configured, and replication.
pub(super) fn listen(shard: &Rc<Shard>) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut listeners = native::listen(shard)?;
    listeners.extend(kafka::listen(shard)?);
    listeners.extend(replication::listen(shard));
    Ok(listeners)
}

pub(super) fn bind(address: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&address.into()).map_err(|error| {
        std::io::Error::new(error.kind(), format!("binding {address}: {error}"))
    })?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// What a request's task (or the reader, for a request it answers itself) hands the writer.
pub(super) enum Outcome {
    /// A response frame, as chunks for one vectored write (records from files where its
    /// empty chunks stand).
    Answer(FrameParts),
    /// No answer is due (Kafka's produce with acks=0, a native request answered by silence).
    NoAnswer,
    /// Send what came before, then close the connection: no honest answer can be given, and
    /// a client waiting for one would wait out its request timeout.
    Close(String),
}

/// What the reader does with a frame.
pub(super) enum Decoded<P: Protocol> {
    /// A request to run in its own task.
    Request(P::Header, P::Request),
    /// Answered at once, without a handler (a request refused as it decoded); keep reading.
    Answered(Outcome),
    /// Close the connection, after this answer if there is one.
    Close(Option<Outcome>, String),
}

/// A TCP protocol the connection driver serves.
pub(super) trait Protocol: 'static {
    /// What each answer needs of its request (correlation id, version, API).
    type Header: std::fmt::Debug + 'static;
    type Request: 'static;
    /// For logs: "native", "kafka".
    const NAME: &'static str;
    /// Requests one connection may have in flight before the reader stops reading.
    const IN_FLIGHT: usize;
    /// Answers leave in request order (Kafka's clients check each answer against their oldest
    /// request), or as they complete (native: matched by correlation id, no head-of-line wait).
    const IN_ORDER: bool;
    /// Frame length prefixes are big-endian (Kafka) or little-endian (native).
    const BIG_ENDIAN: bool;
    /// The bytes of a frame's head that [`Protocol::refuse_frame`] is shown.
    const HEAD_LEN: usize;
    /// Shorter frames cannot be a request at all, and are refused by their length.
    const MIN_FRAME_LEN: usize;

    /// Counts a connection opening (`+1`) or closing (`-1`) in the shard's metrics.
    fn count_connection(shard: &Shard, delta: i64);
    /// The answer to a frame refused by its length (over `max`, or shorter than a header)
    /// before the connection closes; `head` is its first [`Protocol::HEAD_LEN`] bytes when the
    /// frame has that many.
    fn refuse_frame(len: usize, max: usize, head: Option<&[u8]>) -> (Option<Outcome>, String);
    fn decode(shard: &Shard, peer: SocketAddr, body: BytesMut) -> Decoded<Self>
    where
        Self: Sized;
    fn respond(
        shard: Rc<Shard>,
        header: &Self::Header,
        request: Self::Request,
    ) -> impl std::future::Future<Output = Outcome>;
    /// The answer to a request whose handler panicked.
    fn panicked(header: &Self::Header) -> Outcome;
}

/// Accepts connections on `listener` and drives each with protocol `P`.
pub(super) fn accept<P: Protocol>(shard: Rc<Shard>, listener: TcpListener) -> JoinHandle<()> {
    tokio::task::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    strata_client::apply_tcp_congestion(
                        &stream,
                        shard.context.config.tcp_congestion.as_deref(),
                    );
                    tokio::task::spawn_local(drive::<P>(shard.clone(), stream, peer));
                }
                Err(error) => {
                    tracing::warn!(shard = shard.context.index, "accept failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    })
}

/// The next frame's length; `None` once the connection has ended (between frames, inside a
/// prefix, or with an error, which is logged).
async fn next_frame_len<R: tokio::io::AsyncRead + Unpin>(
    frames: &mut strata_client::FrameReader<R>,
    peer: SocketAddr,
) -> Option<usize> {
    match frames.next_len().await {
        Ok(len) => len,
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => None,
        Err(error) => {
            tracing::debug!(%peer, "connection read failed: {error}");
            None
        }
    }
}

/// An answer and the place of its request among the connection's requests.
type Numbered = (u64, Outcome);

/// Counts a connection open for as long as it lives.
struct Open<P: Protocol>(Rc<Shard>, std::marker::PhantomData<P>);

impl<P: Protocol> Open<P> {
    fn new(shard: &Rc<Shard>) -> Self {
        P::count_connection(shard, 1);
        Open(shard.clone(), std::marker::PhantomData)
    }
}

impl<P: Protocol> Drop for Open<P> {
    fn drop(&mut self) {
        P::count_connection(&self.0, -1);
    }
}

/// Serves one connection with protocol `P` until either side ends it.
async fn drive<P: Protocol>(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    let _open = Open::<P>::new(&shard);
    let (reader, writer) = stream.into_split();
    let mut frames = if P::BIG_ENDIAN {
        strata_client::FrameReader::big_endian(reader)
    } else {
        strata_client::FrameReader::new(reader)
    };
    let (answers, outcomes) = mpsc::unbounded_channel::<Numbered>();
    let writing =
        tokio::task::spawn_local(write_answers::<P>(shard.clone(), writer, outcomes, peer));
    let in_flight = std::sync::Arc::new(Semaphore::new(P::IN_FLIGHT));
    let max_frame_bytes = shard.context.config.max_frame_bytes;
    let mut sequence = 0u64;
    loop {
        if answers.is_closed() {
            // The writer closed the connection.
            break;
        }
        let Some(len) = next_frame_len(&mut frames, peer).await else {
            break;
        };
        let number = sequence;
        sequence += 1;
        if len > max_frame_bytes || len < P::MIN_FRAME_LEN {
            // Refused by its length alone: the body is never read, so a huge length costs
            // nothing. The head is read when the protocol answers with what it holds.
            let mut head = vec![0u8; P::HEAD_LEN];
            let readable =
                P::HEAD_LEN > 0 && len >= P::HEAD_LEN && frames.read_exact(&mut head).await.is_ok();
            let (answer, why) =
                P::refuse_frame(len, max_frame_bytes, readable.then_some(&head[..]));
            tracing::warn!(%peer, protocol = P::NAME, frame_bytes = len, max_frame_bytes, "closing connection: {why}");
            if let Some(answer) = answer {
                let _ = answers.send((number, answer));
            }
            break;
        }
        let body = match frames.body(len).await {
            Ok(body) => body,
            Err(error) => {
                tracing::debug!(%peer, protocol = P::NAME, "connection closed mid-frame: {error}");
                break;
            }
        };
        let (header, request) = match P::decode(&shard, peer, body) {
            Decoded::Request(header, request) => (header, request),
            Decoded::Answered(answer) => {
                let _ = answers.send((number, answer));
                continue;
            }
            Decoded::Close(answer, why) => {
                tracing::warn!(%peer, protocol = P::NAME, "closing connection: {why}");
                if let Some(answer) = answer {
                    let _ = answers.send((number, answer));
                }
                break;
            }
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let shard = shard.clone();
        let answers = answers.clone();
        tokio::task::spawn_local(async move {
            // A bug that panics in a handler costs its request: the protocol says how that is
            // answered.
            let outcome = std::panic::AssertUnwindSafe(P::respond(shard, &header, request))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(%peer, protocol = P::NAME, ?header, "a request handler panicked");
                    P::panicked(&header)
                });
            let _ = answers.send((number, outcome));
            drop(permit);
        });
    }
    drop(answers);
    let _ = writing.await;
}

/// At most this many buffers in one vectored write (the kernel takes up to 1024).
const WRITE_COALESCE_CHUNKS: usize = 256;

/// The connection's writer: sends answers (in request order when the protocol asks for it),
/// every answer already waiting in the same write, until the reader and every request are
/// done or an answer closes the connection.
async fn write_answers<P: Protocol>(
    shard: Rc<Shard>,
    mut writer: tokio::net::tcp::OwnedWriteHalf,
    mut outcomes: mpsc::UnboundedReceiver<Numbered>,
    peer: SocketAddr,
) {
    // Answers that came before their turn (in-order protocols only), and the next turn.
    let mut early: BTreeMap<u64, Outcome> = BTreeMap::new();
    let mut next = 0u64;
    let mut closing = None;
    while closing.is_none() {
        let Some(first) = outcomes.recv().await else {
            break;
        };
        let mut batch = FrameParts::from(Vec::new());
        let mut take = |(number, outcome): Numbered, batch: &mut FrameParts| {
            let ready: Vec<Outcome> = if P::IN_ORDER {
                early.insert(number, outcome);
                let mut ready = Vec::new();
                while let Some(outcome) = early.remove(&next) {
                    ready.push(outcome);
                    next += 1;
                }
                ready
            } else {
                vec![outcome]
            };
            for outcome in ready {
                match outcome {
                    Outcome::Answer(frame) if closing.is_none() => {
                        batch.chunks.extend(frame.chunks);
                        batch.elsewhere.extend(frame.elsewhere);
                    }
                    Outcome::Close(why) if closing.is_none() => closing = Some(why),
                    _ => {}
                }
            }
        };
        take(first, &mut batch);
        while batch.chunks.len() < WRITE_COALESCE_CHUNKS
            && let Ok(more) = outcomes.try_recv()
        {
            take(more, &mut batch);
        }
        if let Err(error) = write_frames(&shard, &mut writer, batch).await {
            // A file region cut short (its segment truncated) leaves a frame the client
            // cannot finish: hanging up is the only honest answer.
            tracing::debug!(%peer, protocol = P::NAME, "connection write failed: {error}");
            return;
        }
    }
    if let Some(why) = closing {
        tracing::warn!(%peer, protocol = P::NAME, "closing connection: {why}");
    }
    let _ = writer.shutdown().await;
}

/// Writes frames' chunks with vectored writes and their records from elsewhere (file regions)
/// with `sendfile`, each where its empty chunk stands.
async fn write_frames(
    shard: &Shard,
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    frames: FrameParts,
) -> std::io::Result<()> {
    let mut sources = frames.elsewhere.into_iter();
    let mut chunks = Vec::new();
    for chunk in frames.chunks {
        if !chunk.is_empty() {
            chunks.push(chunk);
            continue;
        }
        strata_client::write_all_chunks(writer, std::mem::take(&mut chunks)).await?;
        let source = sources
            .next()
            .ok_or_else(|| std::io::Error::other("an empty chunk without records elsewhere"))?;
        let region = source
            .source
            .downcast_ref::<FileRegion>()
            .ok_or_else(|| std::io::Error::other("records elsewhere that are not a file region"))?;
        debug_assert_eq!(region.len, source.len as usize);
        send_region(shard, writer.as_ref(), region).await?;
    }
    strata_client::write_all_chunks(writer, chunks).await
}

/// Sends a segment file's range from the page cache to the socket (`sendfile`): the broker
/// neither reads the bytes into memory nor copies them into the socket.
async fn send_region(
    shard: &Shard,
    stream: &tokio::net::TcpStream,
    region: &FileRegion,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let end = region.position + region.len as u64;
    let mut position = region.position as libc::off_t;
    while (position as u64) < end {
        stream.writable().await?;
        let left = (end - position as u64) as usize;
        let sent = stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the call (the stream and the region own
            // them), and `position` is a live local the kernel advances.
            let sent = unsafe {
                libc::sendfile(
                    stream.as_raw_fd(),
                    region.file.as_raw_fd(),
                    &mut position,
                    left,
                )
            };
            if sent < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(sent as usize)
            }
        });
        match sent {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the segment file ends before the fetched range (truncated meanwhile)",
                ));
            }
            Ok(sent) => shard.metrics.sent_from_files(sent as u64),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
