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
//! Each listening socket is an [`Endpoint`]: an address with a security protocol. On a TLS
//! endpoint the driver runs over rustls ([`tls`]) and answers carry their records as bytes (no
//! `sendfile` through TLS); a verified client certificate names the connection's principal. A
//! protocol may authenticate its connections: a request it marks as an authentication step
//! ([`Decoded::Authenticate`]) is run by the reader itself before it reads on, so nothing a
//! client pipelines behind it runs as anyone but who the step decides.
//!
//! Replication has a listener of its own ([`replication`]): QUIC, one stream per request.
//! The admin HTTP endpoint ([`admin`]) runs on the control side, not on a shard.

pub(super) mod admin;
mod broker_configs;
mod group_configs;
pub(super) mod kafka;
pub(super) mod native;
mod native_security;
mod native_share;
mod quota;
pub(super) mod replication;
mod sasl;
pub(crate) mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::BytesMut;
use futures_util::FutureExt;
use strata_auth::Principal;
use strata_wire::protocol::FrameParts;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::log::FileRegion;
use crate::server::messages::Delivery;
use crate::server::security::{ClientAuth, ListenerSpec, SecurityProtocol};
use crate::server::shard::Shard;
use sasl::SaslSession;

/// How long a client may take over its TLS handshake before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One listening socket of a shard: its address and security protocol, and what serves them.
pub(super) struct Endpoint {
    pub(super) spec: ListenerSpec,
    /// The TLS side of a TLS endpoint.
    tls: Option<tls::TlsListener>,
    /// What every endpoint of the shard shares for authentication.
    pub(super) auth: Rc<Authentication>,
}

impl Endpoint {
    /// The endpoint for `spec`; a TLS one loads the node's certificate files now, so a
    /// listener that cannot speak TLS never starts.
    pub(super) fn new(
        shard: &Shard,
        spec: ListenerSpec,
        auth: Rc<Authentication>,
    ) -> std::io::Result<Rc<Endpoint>> {
        let config = &shard.context.config;
        let tls = if spec.protocol.uses_tls() {
            let files = config.tls.as_ref().ok_or_else(|| {
                std::io::Error::other(format!(
                    "the {} listener on {} needs --tls-cert, --tls-key and --tls-ca",
                    spec.protocol, spec.address
                ))
            })?;
            // As in Kafka, client certificates are asked for on SSL listeners only: a
            // SASL_SSL client proves who it is with SASL.
            let client_auth = match spec.protocol {
                SecurityProtocol::Ssl => config.security.client_auth,
                _ => ClientAuth::None,
            };
            let loaded = tls::TlsListener::load(files, client_auth, config.clock.now()).map_err(
                |error| std::io::Error::other(format!("TLS for {}: {error:#}", spec.address)),
            )?;
            Some(loaded)
        } else {
            None
        };
        Ok(Rc::new(Endpoint { spec, tls, auth }))
    }
}

/// What a shard's endpoints share for authentication.
pub(super) struct Authentication {
    /// Keys the salts made up for unknown SCRAM users (see `strata_auth::scram`).
    pub(super) unknown_user_key: [u8; 32],
    /// Failed authentications are logged at most once a second per shard, with a count of
    /// those not logged, so a password-guessing client cannot flood the log.
    failures_logged: std::cell::Cell<Option<std::time::Instant>>,
    failures_unlogged: std::cell::Cell<u64>,
}

impl Authentication {
    pub(super) fn new() -> Rc<Authentication> {
        let mut unknown_user_key = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut unknown_user_key)
            .expect("the system's random source works");
        Rc::new(Authentication {
            unknown_user_key,
            failures_logged: std::cell::Cell::new(None),
            failures_unlogged: std::cell::Cell::new(0),
        })
    }

    /// Logs a failed authentication (rate-limited, see the field).
    pub(super) fn log_failure(
        &self,
        now: std::time::Instant,
        peer: SocketAddr,
        mechanism: &str,
        user: Option<&str>,
        why: &str,
    ) {
        let due = self.failures_logged.get().is_none_or(|last| {
            now.saturating_duration_since(last) >= std::time::Duration::from_secs(1)
        });
        if !due {
            self.failures_unlogged.set(self.failures_unlogged.get() + 1);
            return;
        }
        let unlogged = self.failures_unlogged.replace(0);
        self.failures_logged.set(Some(now));
        tracing::warn!(%peer, mechanism, user = user.unwrap_or("?"), unlogged_failures = unlogged, "authentication failed: {why}");
    }
}

/// Has the control thread make a change to the cluster's settings (users, ACLs, quotas,
/// broker settings); `None` once it is stopping.
pub(super) async fn change_settings(
    shard: &Shard,
    change: crate::server::messages::SettingsChange,
) -> Option<crate::server::messages::SettingsChanged> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    shard
        .context
        .control
        .send(crate::server::messages::ControlMessage::Settings { change, reply })
        .ok()?;
    answer.await.ok()
}

/// A connection as each of its requests sees it.
#[derive(Debug, Clone)]
pub(super) struct Client {
    pub(super) peer: SocketAddr,
    pub(super) listener: ListenerSpec,
    /// Who the connection acts as: its SASL user once authenticated, else its verified client
    /// certificate's subject, else `User:ANONYMOUS`.
    pub(super) principal: Principal,
    /// Until when the connection is not read, its client being over a quota.
    muted: quota::Muted,
}

impl Client {
    /// Whether this client may do `operation` on the resource `kind`/`name` (always, when the
    /// node does not authorize). Reads the shard's copy of the ACLs: no lock, no allocation.
    pub(super) fn may(
        &self,
        shard: &Shard,
        operation: strata_auth::acl::Operation,
        kind: strata_auth::acl::ResourceType,
        name: &str,
    ) -> bool {
        shard.view.borrow().security.authorize(
            &self.principal,
            Some(self.peer.ip()),
            operation,
            kind,
            name,
        )
    }

    /// Whether this client may ask for an idempotent producer id: IdempotentWrite on the
    /// cluster, or Write on any topic (Kafka's rule since 2.8). The topics are scanned only
    /// when the cluster grant is missing.
    pub(super) fn may_write_idempotently(&self, shard: &Shard) -> bool {
        use strata_auth::acl::{CLUSTER_NAME, Operation, ResourceType};
        self.may(
            shard,
            Operation::IdempotentWrite,
            ResourceType::Cluster,
            CLUSTER_NAME,
        ) || shard
            .view
            .borrow()
            .topics
            .iter()
            .any(|known| self.may(shard, Operation::Write, ResourceType::Topic, &known.name))
    }

    /// Whether answers may carry records from files (`sendfile`), which TLS cannot.
    pub(super) fn takes_file_ranges(&self) -> bool {
        !self.listener.protocol.uses_tls()
    }

    /// How fetched records may travel to this client.
    pub(super) fn delivery(&self) -> Delivery {
        if self.takes_file_ranges() {
            Delivery::FileRanges
        } else {
            Delivery::Bytes
        }
    }
}

/// The writing half of a connection, and its socket when records may go from files straight
/// to it.
pub(super) trait AnswerWriter: AsyncWrite + Unpin + 'static {
    /// `None` under TLS: bytes must pass through the TLS session.
    fn socket(&self) -> Option<&TcpStream>;
}

impl AnswerWriter for tokio::net::tcp::OwnedWriteHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl AnswerWriter for tokio::io::WriteHalf<tokio_rustls::server::TlsStream<TcpStream>> {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// Starts every listener a shard serves: the shared client port (SO_REUSEPORT, every
/// shard), this shard's own port, the Kafka address when one is configured, and replication.
pub(super) fn listen(shard: &Rc<Shard>) -> std::io::Result<Vec<JoinHandle<()>>> {
    let auth = Authentication::new();
    let mut listeners = native::listen(shard, &auth)?;
    listeners.extend(kafka::listen(shard, &auth)?);
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
    /// An authentication step, run by the reader before it reads the next frame
    /// ([`Protocol::authenticate`]).
    Authenticate(P::Header, P::Request),
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
    fn decode(
        shard: &Shard,
        session: &SaslSession,
        client: &Client,
        body: BytesMut,
    ) -> Decoded<Self>
    where
        Self: Sized;
    /// Runs an authentication step; gives what to do next (answer and read on, or close). May
    /// change who `client` is.
    fn authenticate(
        shard: &Rc<Shard>,
        endpoint: &Endpoint,
        session: &mut SaslSession,
        client: &mut Client,
        header: Self::Header,
        request: Self::Request,
    ) -> impl std::future::Future<Output = Decoded<Self>>
    where
        Self: Sized;
    fn respond(
        shard: Rc<Shard>,
        client: Client,
        header: &Self::Header,
        request: Self::Request,
    ) -> impl std::future::Future<Output = Outcome>;
    /// The answer to a request whose handler panicked.
    fn panicked(header: &Self::Header) -> Outcome;
}

/// Accepts connections on `listener` and drives each with protocol `P`.
pub(super) fn accept<P: Protocol>(
    shard: Rc<Shard>,
    listener: TcpListener,
    endpoint: Rc<Endpoint>,
) -> JoinHandle<()> {
    tokio::task::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    strata_net::apply_tcp_congestion(
                        &stream,
                        shard.context.config.tcp_congestion.as_deref(),
                    );
                    tokio::task::spawn_local(serve::<P>(
                        shard.clone(),
                        endpoint.clone(),
                        stream,
                        peer,
                    ));
                }
                Err(error) => {
                    tracing::warn!(shard = shard.context.index, "accept failed: {error}");
                    let clock = shard.context.config.clock;
                    clock.sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    })
}

/// The next frame's length; `None` once the connection has ended (between frames, inside a
/// prefix, or with an error, which is logged).
async fn next_frame_len<R: tokio::io::AsyncRead + Unpin>(
    frames: &mut strata_net::FrameReader<R>,
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

/// Serves one accepted connection: in the clear, or after a TLS handshake.
async fn serve<P: Protocol>(
    shard: Rc<Shard>,
    endpoint: Rc<Endpoint>,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let mut client = Client {
        peer,
        listener: endpoint.spec,
        principal: Principal::anonymous(),
        muted: quota::Muted::default(),
    };
    let Some(tls) = &endpoint.tls else {
        let (reader, writer) = stream.into_split();
        return drive::<P, _, _>(shard, endpoint, client, reader, writer).await;
    };
    let clock = shard.context.config.clock;
    let acceptor = tls.acceptor(clock.now());
    match clock
        .timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream))
        .await
    {
        Some(Ok(stream)) => {
            if let Some(principal) =
                tls::certificate_principal(stream.get_ref().1.peer_certificates())
            {
                client.principal = principal;
            }
            let (reader, writer) = tokio::io::split(stream);
            drive::<P, _, _>(shard, endpoint, client, reader, writer).await
        }
        Some(Err(error)) => {
            tracing::warn!(%peer, protocol = P::NAME, listener = %endpoint.spec, "TLS handshake failed: {error}");
        }
        None => {
            tracing::warn!(%peer, protocol = P::NAME, listener = %endpoint.spec, "TLS handshake not finished in {TLS_HANDSHAKE_TIMEOUT:?}");
        }
    }
}

/// Serves one connection with protocol `P` until either side ends it.
async fn drive<P: Protocol, R: AsyncRead + Unpin, W: AnswerWriter>(
    shard: Rc<Shard>,
    endpoint: Rc<Endpoint>,
    mut client: Client,
    reader: R,
    writer: W,
) {
    let _open = Open::<P>::new(&shard);
    let peer = client.peer;
    let mut session = SaslSession::new(endpoint.spec.protocol.uses_sasl());
    let mut frames = if P::BIG_ENDIAN {
        strata_net::FrameReader::big_endian(reader)
    } else {
        strata_net::FrameReader::new(reader)
    };
    let (answers, outcomes) = mpsc::unbounded_channel::<Numbered>();
    let writing =
        tokio::task::spawn_local(write_answers::<P, W>(shard.clone(), writer, outcomes, peer));
    let in_flight = std::sync::Arc::new(Semaphore::new(P::IN_FLIGHT));
    let mut sequence = 0u64;
    loop {
        if answers.is_closed() {
            // The writer closed the connection.
            break;
        }
        // A client over a quota is not read from for as long as its last answer told it to
        // wait (KIP-219); a hold set while the next frame was awaited is kept below.
        client.muted.wait(&shard.context.config.clock).await;
        let Some(len) = next_frame_len(&mut frames, peer).await else {
            break;
        };
        let number = sequence;
        sequence += 1;
        let max_frame_bytes = session.max_frame_bytes(shard.context.config.max_frame_bytes);
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
        client.muted.wait(&shard.context.config.clock).await;
        let mut decoded = P::decode(&shard, &session, &client, body);
        if let Decoded::Authenticate(header, request) = decoded {
            decoded = P::authenticate(
                &shard,
                &endpoint,
                &mut session,
                &mut client,
                header,
                request,
            )
            .await;
        }
        let (header, request) = match decoded {
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
            Decoded::Authenticate(..) => {
                tracing::error!(%peer, protocol = P::NAME, "an authentication step answered with another");
                break;
            }
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let shard = shard.clone();
        let answers = answers.clone();
        let client = client.clone();
        tokio::task::spawn_local(async move {
            // A bug that panics in a handler costs its request: the protocol says how that is
            // answered.
            let outcome = std::panic::AssertUnwindSafe(P::respond(shard, client, &header, request))
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
async fn write_answers<P: Protocol, W: AnswerWriter>(
    shard: Rc<Shard>,
    mut writer: W,
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
async fn write_frames<W: AnswerWriter>(
    shard: &Shard,
    writer: &mut W,
    frames: FrameParts,
) -> std::io::Result<()> {
    let mut sources = frames.elsewhere.into_iter();
    let mut chunks = Vec::new();
    for chunk in frames.chunks {
        if !chunk.is_empty() {
            chunks.push(chunk);
            continue;
        }
        strata_net::write_all_chunks(writer, std::mem::take(&mut chunks)).await?;
        let source = sources
            .next()
            .ok_or_else(|| std::io::Error::other("an empty chunk without records elsewhere"))?;
        let region = source
            .source
            .downcast_ref::<FileRegion>()
            .ok_or_else(|| std::io::Error::other("records elsewhere that are not a file region"))?;
        debug_assert_eq!(region.len, source.len as usize);
        let socket = writer.socket().ok_or_else(|| {
            std::io::Error::other(
                "records from a file on a TLS connection (answers there carry bytes)",
            )
        })?;
        send_region(shard, socket, region).await?;
    }
    strata_net::write_all_chunks(writer, chunks).await
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
