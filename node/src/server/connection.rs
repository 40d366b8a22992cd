//! Listeners and connections: frames in, requests dispatched concurrently, responses out.
//!
//! A connection reads frames one after another and starts each request as its own task, so
//! requests are pipelined and responses go out as they complete (matched by correlation id).
//! A bounded number of requests per connection are in flight; past it, the reader waits.
//!
//! Bad input never takes the node down: an oversized frame gets MESSAGE_TOO_LARGE and the
//! connection is closed (its body is never read, never allocated); an undecodable request gets
//! a typed error response; a broken socket ends that connection only. Each is logged with why.

use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Buf;
use futures_util::FutureExt;
use strata_wire::protocol::{ErrorCode, FrameParts, REQUEST_HEADER_LEN, Request, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::log::FileRegion;

use super::shard::Shard;

/// Requests one connection may have in flight before the reader stops reading.
const IN_FLIGHT_PER_CONNECTION: usize = 256;

/// Binds the shared client port (SO_REUSEPORT, every shard) and this shard's own port, and
/// starts accepting on both.
pub(super) fn listen(shard: &Rc<Shard>) -> std::io::Result<Vec<JoinHandle<()>>> {
    let config = &shard.context.config;
    let shared = bind(config.listen, true)?;
    let own_address = SocketAddr::new(config.listen.ip(), config.shard_port(shard.context.index));
    let own = bind(own_address, false)?;
    Ok(vec![
        accept(shard.clone(), shared, serve),
        accept(shard.clone(), own, serve),
    ])
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

/// Accepts connections on `listener` and runs `serve` for each (the native protocol's, or the
/// Kafka listener's).
pub(super) fn accept<Serve, Served>(
    shard: Rc<Shard>,
    listener: TcpListener,
    serve: Serve,
) -> JoinHandle<()>
where
    Serve: Fn(Rc<Shard>, TcpStream, SocketAddr) -> Served + 'static,
    Served: std::future::Future<Output = ()> + 'static,
{
    tokio::task::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    strata_client::apply_tcp_congestion(
                        &stream,
                        shard.context.config.tcp_congestion.as_deref(),
                    );
                    tokio::task::spawn_local(serve(shard.clone(), stream, peer));
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
pub(super) async fn next_frame_len<R: tokio::io::AsyncRead + Unpin>(
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

/// At most this many buffers in one vectored write (the kernel takes up to 1024).
const WRITE_COALESCE_CHUNKS: usize = 256;

async fn serve(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    let (reader, mut writer) = stream.into_split();
    let mut frames = strata_client::FrameReader::new(reader);
    let (responses, mut outgoing) = mpsc::unbounded_channel::<FrameParts>();
    let writing = tokio::task::spawn_local(async move {
        while let Some(mut frames) = outgoing.recv().await {
            // Every response already waiting goes out in the same vectored write.
            while frames.chunks.len() < WRITE_COALESCE_CHUNKS
                && let Ok(more) = outgoing.try_recv()
            {
                frames.chunks.extend(more.chunks);
                frames.elsewhere.extend(more.elsewhere);
            }
            if let Err(error) = write_frames(&mut writer, frames).await {
                // A file region cut short (its segment truncated) leaves a frame the client
                // cannot finish: hanging up is the only honest answer.
                tracing::debug!(%peer, "connection write failed: {error}");
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let in_flight = std::sync::Arc::new(Semaphore::new(IN_FLIGHT_PER_CONNECTION));
    let max_frame_bytes = shard.context.config.max_frame_bytes;
    loop {
        let Some(len) = next_frame_len(&mut frames, peer).await else {
            break;
        };
        if len > max_frame_bytes || len < REQUEST_HEADER_LEN {
            // Answer with the correlation id if the header is there, then hang up: the body is
            // never read, so a huge length costs nothing.
            let mut header = [0u8; REQUEST_HEADER_LEN];
            let readable =
                len >= REQUEST_HEADER_LEN && frames.read_exact(&mut header).await.is_ok();
            let code = if len > max_frame_bytes {
                ErrorCode::MessageTooLarge
            } else {
                ErrorCode::InvalidRequest
            };
            if readable {
                let correlation_id = (&header[4..8]).get_u32_le();
                let _ = responses.send(Response::encode_error(correlation_id, code).into());
            }
            tracing::warn!(%peer, frame_bytes = len, max_frame_bytes, "closing connection: frame of {len} bytes ({code})");
            break;
        }
        let body = match frames.body(len).await {
            Ok(body) => body,
            Err(error) => {
                tracing::debug!(%peer, "connection closed mid-frame: {error}");
                break;
            }
        };
        let (header, request) = match Request::decode(body) {
            Ok(decoded) => decoded,
            Err(rejected) => {
                tracing::warn!(%peer, code = %rejected.code, "rejected request: {}", rejected.reason);
                match rejected.header {
                    Some(header) => {
                        let _ = responses.send(
                            Response::encode_error(header.correlation_id, rejected.code).into(),
                        );
                        continue;
                    }
                    None => break,
                }
            }
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let shard = shard.clone();
        let responses = responses.clone();
        tokio::task::spawn_local(async move {
            // A bug that panics in a handler costs its request, answered as INTERNAL: without
            // the answer the client would wait out its request timeout and send it again.
            let handled = std::panic::AssertUnwindSafe(shard.handle(request))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(%peer, correlation_id = header.correlation_id,
                        "a request handler panicked: answered INTERNAL");
                    Some(Err(ErrorCode::Internal))
                });
            match handled {
                Some(Ok(response)) => {
                    let _ = responses.send(response.encode_parts(header.correlation_id));
                }
                Some(Err(code)) => {
                    let _ =
                        responses.send(Response::encode_error(header.correlation_id, code).into());
                }
                None => {}
            }
            drop(permit);
        });
    }
    drop(responses);
    let _ = writing.await;
}

/// Writes frames' chunks with vectored writes and their records from elsewhere (file regions)
/// with `sendfile`, each where its empty chunk stands.
async fn write_frames(
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
        send_region(writer.as_ref(), region).await?;
    }
    strata_client::write_all_chunks(writer, chunks).await
}

/// Sends a segment file's range from the page cache to the socket (`sendfile`): the broker
/// neither reads the bytes into memory nor copies them into the socket.
async fn send_region(stream: &tokio::net::TcpStream, region: &FileRegion) -> std::io::Result<()> {
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
            Ok(sent) => SENT_FROM_FILES.with(|total| total.set(total.get() + sent as u64)),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

thread_local! {
    /// Bytes this shard sent to consumers straight from segment files.
    static SENT_FROM_FILES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes this thread (a shard) has sent from segment files with `sendfile` (for `/metrics`).
pub fn sent_from_files() -> u64 {
    SENT_FROM_FILES.with(std::cell::Cell::get)
}
