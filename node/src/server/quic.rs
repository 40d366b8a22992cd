//! QUIC between brokers: one quinn endpoint per shard, carrying replication fetches.
//!
//! Each request travels on its own bidirectional stream (one frame each way, then the stream
//! ends), so partitions never wait behind each other: a slow partition's long-poll holds only
//! its own stream. A shard keeps one connection per peer shard and opens streams on it.
//!
//! TLS: by default every node makes a self-signed certificate at start and peers accept any
//! certificate (the link is encrypted but not authenticated, like a plaintext Kafka listener
//! with encryption on top). With `--tls-cert/--tls-key/--tls-ca` a node presents that
//! certificate and verifies its peers against the CA, by the peer's advertised host name.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use strata_wire::AlignedVec;
use strata_wire::protocol::{
    ApiKey, ErrorCode, FRAME_PREFIX_LEN, ReplicaFetchRequest, Request, Response,
};

use crate::io::DIRECT_BLOCK;
use crate::log::PlacedBatches;
use crate::replicator::ReplicaFetchAnswer;

/// ALPN of the broker-to-broker protocol.
const ALPN: &[u8] = b"strata-replication/0";
/// UDP socket buffers: the defaults (about 200 KiB) drop packets at replication rates.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
/// The largest UDP payload accepted and probed for (the IPv6 maximum).
const UDP_PAYLOAD_MAX: u16 = 65_527;
/// How long after a suspected MTU black hole path MTU discovery probes again.
const MTU_BLACK_HOLE_COOLDOWN: Duration = Duration::from_secs(2);
/// The largest response frame a follower accepts (a fetch's max bytes plus framing).
const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// Certificate files for real TLS (all three, or none for the self-signed default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("stream to {addr}: {reason}")]
    Stream { addr: SocketAddr, reason: String },
    #[error("malformed answer from {addr}: {reason}")]
    Malformed { addr: SocketAddr, reason: String },
    #[error("{addr} refused the request: {code}")]
    Refused { addr: SocketAddr, code: ErrorCode },
    /// The broker cannot be reached: its address is not known, or this node has no endpoint.
    #[error("no route to broker {broker}: {reason}")]
    NoRoute { broker: i32, reason: String },
}

/// The shard's endpoint: accepts peers' streams and opens its own.
pub struct QuicPeer {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    connections: RefCell<HashMap<SocketAddr, quinn::Connection>>,
    verify_names: bool,
}

impl QuicPeer {
    /// Binds `addr` (UDP) with large socket buffers. Call inside the shard's runtime.
    pub fn bind(addr: SocketAddr, tls: Option<&TlsFiles>) -> anyhow::Result<QuicPeer> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (certs, key) = match tls {
            Some(files) => (read_certs(&files.cert)?, read_key(&files.key)?),
            None => {
                let generated = rcgen::generate_simple_self_signed(vec!["strata-node".into()])?;
                (
                    vec![generated.cert.der().clone()],
                    PrivateKeyDer::Pkcs8(generated.key_pair.serialize_der().into()),
                )
            }
        };
        let roots = match tls {
            Some(files) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(&files.ca)? {
                    roots.add(cert)?;
                }
                Some(Arc::new(roots))
            }
            None => None,
        };
        let server_builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let mut server_crypto = match &roots {
            // Mutual TLS: a follower must show a certificate from the same CA.
            Some(roots) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.clone(),
                    provider.clone(),
                )
                .build()?;
                server_builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(certs.clone(), key.clone_key())?
            }
            None => server_builder
                .with_no_client_auth()
                .with_single_cert(certs.clone(), key.clone_key())?,
        };
        server_crypto.alpn_protocols = vec![ALPN.to_vec()];
        let mut server_config =
            quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(server_crypto)?));
        // Brokers talking over loopback (one host) are told apart by the address they bind.
        let segmentation_offload = !addr.ip().is_loopback();
        server_config.transport_config(transport(segmentation_offload));

        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let mut client_crypto = match &roots {
            Some(roots) => builder
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(certs, key)?,
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth(),
        };
        client_crypto.alpn_protocols = vec![ALPN.to_vec()];
        let mut client_config =
            quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(client_crypto)?));
        client_config.transport_config(transport(segmentation_offload));

        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        for (what, result) in [
            (
                "SO_RCVBUF",
                socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES),
            ),
            (
                "SO_SNDBUF",
                socket.set_send_buffer_size(SOCKET_BUFFER_BYTES),
            ),
        ] {
            if let Err(error) = result {
                tracing::warn!("setting {what} on the replication socket: {error}");
            }
        }
        socket.bind(&addr.into())?;
        let mut endpoint_config = quinn::EndpointConfig::default();
        endpoint_config.max_udp_payload_size(UDP_PAYLOAD_MAX)?;
        let endpoint = quinn::Endpoint::new(
            endpoint_config,
            Some(server_config),
            socket.into(),
            Arc::new(quinn::TokioRuntime),
        )?;
        Ok(QuicPeer {
            endpoint,
            client_config,
            connections: RefCell::new(HashMap::new()),
            verify_names: tls.is_some(),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// The client side's settings (TLS, transport), for benchmarks that dial raw connections.
    pub fn client_config(&self) -> &quinn::ClientConfig {
        &self.client_config
    }

    async fn connection(
        &self,
        addr: SocketAddr,
        host: &str,
    ) -> Result<quinn::Connection, QuicError> {
        if let Some(connection) = self.connections.borrow().get(&addr)
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        let connect_error = |reason: String| QuicError::Connect { addr, reason };
        let name = if self.verify_names {
            host
        } else {
            "strata-node"
        };
        let connecting = self
            .endpoint
            .connect_with(self.client_config.clone(), addr, name)
            .map_err(|error| connect_error(error.to_string()))?;
        let connection = connecting
            .await
            .map_err(|error| connect_error(error.to_string()))?;
        self.connections
            .borrow_mut()
            .insert(addr, connection.clone());
        Ok(connection)
    }

    /// Sends a follower fetch on a new stream and reads the answer. With `records_phase` (the follower's
    /// [`crate::log::PartitionLog::direct_phase`]), the answer's records are read straight into
    /// a block-aligned buffer at that phase ([`PlacedBatches`]), so the direct write of them
    /// copies nothing more.
    pub async fn replica_fetch(
        &self,
        addr: SocketAddr,
        host: &str,
        request: ReplicaFetchRequest,
        records_phase: Option<usize>,
    ) -> Result<ReplicaFetchAnswer, QuicError> {
        let chunks = Request::ReplicaFetch(request).encode(0);
        let answer = self
            .exchange(addr, host, chunks, async |receive| {
                read_replica_answer(receive, RESPONSE_BYTES_MAX, records_phase).await
            })
            .await?;
        let malformed = |reason: String| QuicError::Malformed { addr, reason };
        let (decoded, placed) = match answer {
            RawAnswer::Frame(frame) => (Response::decode(ApiKey::ReplicaFetch, frame), None),
            RawAnswer::Placed { head, placed } => (Ok(head), Some(placed)),
        };
        match decoded {
            Ok((_, Ok(Response::ReplicaFetch(response)))) => {
                Ok(ReplicaFetchAnswer { response, placed })
            }
            Ok((_, Ok(other))) => Err(malformed(format!("{:?} answer", other.api_key()))),
            Ok((_, Err(code))) => Err(QuicError::Refused { addr, code }),
            Err(error) => Err(malformed(error.to_string())),
        }
    }

    /// Sends a broker-to-broker request other than a follower fetch (a transaction's
    /// markers) on a new stream and reads its answer, whole.
    pub async fn call(
        &self,
        addr: SocketAddr,
        host: &str,
        request: Request,
    ) -> Result<Response, QuicError> {
        let api = request.api_key();
        let frame = self
            .exchange(addr, host, request.encode(0), async |receive| {
                read_frame(receive, RESPONSE_BYTES_MAX).await
            })
            .await?;
        match Response::decode(api, frame) {
            Ok((_, Ok(response))) if response.api_key() == api => Ok(response),
            Ok((_, Ok(other))) => Err(QuicError::Malformed {
                addr,
                reason: format!("{:?} answer", other.api_key()),
            }),
            Ok((_, Err(code))) => Err(QuicError::Refused { addr, code }),
            Err(error) => Err(QuicError::Malformed {
                addr,
                reason: error.to_string(),
            }),
        }
    }

    /// One request on a new stream of the peer's connection: `chunks` sent, the stream
    /// finished, the answer read by `read`. A failure drops the connection (the next call
    /// reconnects).
    async fn exchange<T>(
        &self,
        addr: SocketAddr,
        host: &str,
        mut chunks: Vec<Bytes>,
        read: impl AsyncFnOnce(&mut quinn::RecvStream) -> Result<T, String>,
    ) -> Result<T, QuicError> {
        let connection = self.connection(addr, host).await?;
        let stream_error = |reason: String| QuicError::Stream { addr, reason };
        let result = async {
            let (mut send, mut receive) = connection
                .open_bi()
                .await
                .map_err(|error| stream_error(error.to_string()))?;
            send.write_all_chunks(&mut chunks)
                .await
                .map_err(|error| stream_error(error.to_string()))?;
            send.finish()
                .map_err(|error| stream_error(error.to_string()))?;
            read(&mut receive).await.map_err(stream_error)
        }
        .await;
        if result.is_err() {
            self.connections.borrow_mut().remove(&addr);
        }
        result
    }

    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"shutting down");
    }
}

/// Reads one request frame from a peer's stream. `None` with a reason when the peer sent
/// something that is not one whole frame.
pub async fn read_request(
    receive: &mut quinn::RecvStream,
    max_frame_bytes: usize,
) -> Result<(u32, Request), String> {
    let body = read_frame(receive, max_frame_bytes).await?;
    match Request::decode(body) {
        Ok((header, request)) => Ok((header.correlation_id, request)),
        Err(rejected) => Err(rejected.reason),
    }
}

/// Writes a response frame and ends the stream.
pub async fn write_response(send: &mut quinn::SendStream, mut chunks: Vec<Bytes>) {
    if send.write_all_chunks(&mut chunks).await.is_ok() {
        let _ = send.finish();
    }
}

/// A ReplicaFetch answer as read: a whole frame to decode, or its decoded head and its records
/// in place.
enum RawAnswer {
    Frame(BytesMut),
    Placed {
        head: (u32, Result<Response, ErrorCode>),
        placed: PlacedBatches,
    },
}

/// The answer's fields before its records take fewer bytes than this.
const ANSWER_HEAD_BYTES: usize = 512;

/// Reads a ReplicaFetch answer that must be all the stream holds. Without `records_phase`, as
/// [`read_frame`]. With it: the first bytes are decoded alone to find where the records start,
/// and the frame is read into a block-aligned buffer shifted so that they start at
/// `records_phase` within a block, with a block of room after them for padding (one copy from
/// quinn's chunks, as `read_frame` makes).
async fn read_replica_answer(
    receive: &mut quinn::RecvStream,
    max_bytes: usize,
    records_phase: Option<usize>,
) -> Result<RawAnswer, String> {
    let Some(phase) = records_phase else {
        return read_frame(receive, max_bytes).await.map(RawAnswer::Frame);
    };
    debug_assert!(phase < DIRECT_BLOCK);
    let len = read_frame_len(receive, max_bytes).await?;
    let mut head = BytesMut::with_capacity(len.min(ANSWER_HEAD_BYTES));
    read_into(receive, len.min(ANSWER_HEAD_BYTES), |chunk| {
        head.extend_from_slice(chunk)
    })
    .await?;
    let (correlation_id, response, records) =
        Response::decode_head(ApiKey::ReplicaFetch, head.clone())
            .map_err(|error| error.to_string())?;
    let Some((records_at, records_len)) = records.filter(|(_, records_len)| *records_len > 0)
    else {
        // No records to place (a refusal, a divergence, an empty answer): the whole frame.
        let mut frame = head;
        frame.reserve(len - frame.len());
        read_into(receive, len - frame.len(), |chunk| {
            frame.extend_from_slice(chunk)
        })
        .await?;
        expect_end(receive, len).await?;
        return Ok(RawAnswer::Frame(frame));
    };
    if records_at + records_len != len {
        return Err(format!(
            "the records end at {} of a {len}-byte frame",
            records_at + records_len
        ));
    }
    let shift = (phase + DIRECT_BLOCK - records_at % DIRECT_BLOCK) % DIRECT_BLOCK;
    let mut buf = AlignedVec::<DIRECT_BLOCK>::with_capacity(shift + len + DIRECT_BLOCK);
    buf.resize(shift, 0);
    buf.extend_from_slice(&head);
    read_into(receive, len - head.len(), |chunk| {
        buf.extend_from_slice(chunk)
    })
    .await?;
    expect_end(receive, len).await?;
    let placed = PlacedBatches::new(buf, shift + records_at..shift + len);
    Ok(RawAnswer::Placed {
        head: (correlation_id, response),
        placed,
    })
}

async fn read_frame_len(
    receive: &mut quinn::RecvStream,
    max_bytes: usize,
) -> Result<usize, String> {
    let mut prefix = [0u8; FRAME_PREFIX_LEN];
    receive
        .read_exact(&mut prefix)
        .await
        .map_err(|error| format!("reading the frame length: {error}"))?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max_bytes {
        return Err(format!(
            "a {len}-byte frame is over the {max_bytes}-byte limit"
        ));
    }
    Ok(len)
}

/// Hands the stream's next `len` bytes to `take`, chunk by chunk as quinn holds them.
async fn read_into(
    receive: &mut quinn::RecvStream,
    len: usize,
    mut take: impl FnMut(&[u8]),
) -> Result<(), String> {
    let mut left = len;
    while left > 0 {
        match receive.read_chunk(left, true).await {
            Ok(Some(chunk)) => {
                left -= chunk.bytes.len();
                take(&chunk.bytes);
            }
            Ok(None) => {
                return Err(format!(
                    "the stream ended {left} bytes before the frame did"
                ));
            }
            Err(error) => return Err(error.to_string()),
        }
    }
    Ok(())
}

/// The frame must be all the stream holds.
async fn expect_end(receive: &mut quinn::RecvStream, len: usize) -> Result<(), String> {
    match receive.read_chunk(1, true).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(format!("bytes after the {len}-byte frame")),
        Err(error) => Err(error.to_string()),
    }
}

/// Reads one length-prefixed frame that must be all the stream holds, into one buffer of the
/// frame's size: quinn's received chunks are copied once, with no growing buffer and no
/// zeroing. A longer, shorter or oversized frame is an error (the caller resets the stream).
async fn read_frame(receive: &mut quinn::RecvStream, max_bytes: usize) -> Result<BytesMut, String> {
    let len = read_frame_len(receive, max_bytes).await?;
    let mut body = BytesMut::with_capacity(len);
    read_into(receive, len, |chunk| body.extend_from_slice(chunk)).await?;
    expect_end(receive, len).await?;
    Ok(body)
}

/// Transport settings for both sides of a link. `segmentation_offload`: let quinn hand the
/// kernel one buffer of many datagrams (UDP GSO), which saves CPU where datagrams are small
/// (1,500-byte Ethernet). On loopback a datagram already fills a 64 KiB send, and with GSO on
/// quinn lost packets in bursts (its black-hole detector then dropped the path MTU to 1200)
/// and moved a third of the bytes: `cargo bench --bench quic` gave 380–390 MB/s with it and
/// 1.2 GB/s without (fetch-shaped; docs/performance.md).
fn transport(segmentation_offload: bool) -> Arc<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport.enable_segmentation_offload(segmentation_offload);
    // Let path MTU discovery go as high as the path allows (quinn probes and backs off on
    // black holes): ~1452 on plain Ethernet, ~8950 with jumbo frames, 64 KiB on loopback. Each
    // datagram costs a syscall and a seal, so bigger ones move bytes for less CPU.
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(UDP_PAYLOAD_MAX);
    // A burst of congestion losses looks like an MTU black hole to quinn, which then sends
    // 1200-byte datagrams until the cooldown ends (a minute by default): on loopback that is
    // 50 times the datagrams for the same bytes. Probing again soon costs a few padding
    // packets where the hole is real.
    mtu.black_hole_cooldown(MTU_BLACK_HOLE_COOLDOWN);
    transport.mtu_discovery_config(Some(mtu));
    transport
        .max_concurrent_bidi_streams(4096u32.into())
        .stream_receive_window((16u32 << 20).into())
        .receive_window((64u32 << 20).into())
        .send_window(64 << 20)
        .keep_alive_interval(Some(Duration::from_millis(500)))
        .max_idle_timeout(Some(
            Duration::from_secs(5)
                .try_into()
                .expect("5 s is a valid idle timeout"),
        ));
    Arc::new(transport)
}

fn read_certs(path: &PathBuf) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let file = std::fs::File::open(path)
        .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    let certs =
        rustls_pemfile::certs(&mut std::io::BufReader::new(file)).collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(!certs.is_empty(), "{}: no certificate", path.display());
    Ok(certs)
}

fn read_key(path: &PathBuf) -> anyhow::Result<PrivateKeyDer<'static>> {
    let file = std::fs::File::open(path)
        .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    rustls_pemfile::private_key(&mut std::io::BufReader::new(file))?
        .ok_or_else(|| anyhow::anyhow!("{}: no private key", path.display()))
}

/// The default's verifier: any certificate, but the handshake signature is still checked, so
/// the peer holds the key of the certificate it showed.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
