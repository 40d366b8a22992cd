//! One pipelined connection to a broker port.
//!
//! Requests are written as soon as they are made; a reader task matches responses to requests
//! by correlation id, so many requests share the connection and complete in any order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use strata_wire::protocol::{ApiKey, Request, Response};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::ClientError;
use crate::security::Security;
use strata_net::{FrameReader, write_all_chunks};

type Pending = Arc<Mutex<HashMap<u32, (ApiKey, oneshot::Sender<Result<Response, ClientError>>)>>>;

/// The largest response frame a client accepts.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// The writing half of a connection, in the clear or through TLS.
type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

pub struct Connection {
    address: SocketAddr,
    writer: tokio::sync::Mutex<Writer>,
    pending: Pending,
    next_correlation_id: AtomicU32,
}

impl Connection {
    /// Connects to `address` in the clear, with the congestion control `tcp_congestion`
    /// (`None`: the host's default).
    pub async fn connect(
        address: SocketAddr,
        tcp_congestion: Option<&str>,
    ) -> Result<Arc<Connection>, ClientError> {
        let host = address.ip().to_string();
        Connection::connect_secured(address, &host, tcp_congestion, &Security::default()).await
    }

    /// Connects to `address` (the broker named `host`, which its TLS certificate must name)
    /// with `security`: TLS around the connection, then the SASL exchange, before it is used.
    pub async fn connect_secured(
        address: SocketAddr,
        host: &str,
        tcp_congestion: Option<&str>,
        security: &Security,
    ) -> Result<Arc<Connection>, ClientError> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|error| ClientError::Connect {
                address,
                reason: error.to_string(),
            })?;
        let _ = stream.set_nodelay(true);
        crate::apply_tcp_congestion(&stream, tcp_congestion);
        let (reader, writer): (Reader, Writer) = match &security.tls {
            None => {
                let (reader, writer) = stream.into_split();
                (Box::new(reader), Box::new(writer))
            }
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|error| ClientError::InvalidArgument(format!("{host}: {error}")))?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, stream)
                    .await
                    .map_err(|error| {
                        ClientError::Authentication(format!("TLS with {address}: {error}"))
                    })?;
                let (reader, writer) = tokio::io::split(tls);
                (Box::new(reader), Box::new(writer))
            }
        };
        let connection = Connection::start(address, reader, writer);
        if let Some(credentials) = &security.sasl {
            crate::security::authenticate(&connection, credentials).await?;
        }
        Ok(connection)
    }

    /// Starts the reader task of a connection whose stream is set up.
    fn start(address: SocketAddr, reader: Reader, writer: Writer) -> Arc<Connection> {
        let mut frames = FrameReader::new(reader);
        let pending: Pending = Arc::default();
        let connection = Arc::new(Connection {
            address,
            writer: tokio::sync::Mutex::new(writer),
            pending: pending.clone(),
            next_correlation_id: AtomicU32::new(1),
        });
        tokio::spawn(async move {
            let failure = loop {
                let len = match frames.next_len().await {
                    Ok(Some(len)) => len,
                    Ok(None) => {
                        break ClientError::Disconnected("connection closed by the broker".into());
                    }
                    Err(error) => break ClientError::Disconnected(error.to_string()),
                };
                if len > MAX_RESPONSE_BYTES {
                    break ClientError::Protocol(format!("response frame of {len} bytes"));
                }
                let body = match frames.body(len).await {
                    Ok(body) => body,
                    Err(error) => break ClientError::Disconnected(error.to_string()),
                };
                let Some(correlation_id) = Response::peek_correlation_id(&body) else {
                    break ClientError::Protocol("response without a correlation id".into());
                };
                let Some((api, reply)) = pending.lock().expect("pending").remove(&correlation_id)
                else {
                    break ClientError::Protocol(format!(
                        "unexpected correlation id {correlation_id}"
                    ));
                };
                let result = match Response::decode(api, body) {
                    Ok((_, Ok(response))) => Ok(response),
                    Ok((_, Err(code))) => Err(ClientError::Broker(code)),
                    Err(error) => Err(ClientError::Protocol(error.to_string())),
                };
                let _ = reply.send(result);
            };
            // Fail everything still waiting.
            for (_, (_, reply)) in pending.lock().expect("pending").drain() {
                let _ = reply.send(Err(failure.clone()));
            }
        });
        connection
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sends a request and waits for its response.
    pub async fn request(&self, request: Request) -> Result<Response, ClientError> {
        let answer = self.send(request, true).await?;
        answer
            .expect("a response was asked for")
            .await
            .map_err(|_| ClientError::Disconnected("connection closed".into()))?
    }

    /// Writes a request and returns at once; its response arrives on the receiver. Requests
    /// written one after another reach the broker in that order.
    pub async fn send_request(
        &self,
        request: Request,
    ) -> Result<oneshot::Receiver<Result<Response, ClientError>>, ClientError> {
        let answer = self.send(request, true).await?;
        Ok(answer.expect("a response was asked for"))
    }

    /// Sends a request that gets no response (produce with acks=0).
    pub async fn send_without_response(&self, request: Request) -> Result<(), ClientError> {
        self.send(request, false).await.map(drop)
    }

    async fn send(
        &self,
        request: Request,
        expect_response: bool,
    ) -> Result<Option<oneshot::Receiver<Result<Response, ClientError>>>, ClientError> {
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let api = request.api_key();
        let answer = expect_response.then(|| {
            let (reply, answer) = oneshot::channel();
            self.pending
                .lock()
                .expect("pending")
                .insert(correlation_id, (api, reply));
            answer
        });
        let chunks = request.encode(correlation_id);
        let mut writer = self.writer.lock().await;
        if let Err(error) = write_all_chunks(&mut *writer, chunks).await {
            self.pending
                .lock()
                .expect("pending")
                .remove(&correlation_id);
            return Err(ClientError::Disconnected(error.to_string()));
        }
        Ok(answer)
    }

    /// True once the reader has seen the connection end.
    pub fn is_closed(&self) -> bool {
        Arc::strong_count(&self.pending) == 1
    }
}
