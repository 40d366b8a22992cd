//! The channel the etcd client sends every request through: one etcd member at a time, the
//! next one as soon as a request to it fails in transport, as etcd's own Go client pins one
//! member and moves on.
//!
//! etcd-client's default is tonic's balanced channel over every member. With one member of
//! three down it kept picking the dead one (it looks least loaded: nothing in flight), so most
//! requests, and every broker's lease keep-alive that happened to run on it, failed while
//! etcd itself was healthy: brokers could not read the cluster, lost the controller, and would
//! have dropped out when their leases ran out.
//!
//! A request that fails in transport is not retried here (its body may already be gone); the
//! caller's next request goes to the next member. Members that answer with a gRPC error
//! (e.g. no leader) are not skipped: that answer is etcd's to give.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use etcd_client::{BalancedChannelBuilder, Channel};
use http::Uri;
use tokio::sync::mpsc;
use tonic::transport::Endpoint;
use tonic::transport::channel::Change;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

type Request = http::Request<tonic::body::Body>;
type Response = http::Response<tonic::body::Body>;
type Changes = mpsc::Receiver<Change<Uri, Endpoint>>;

/// Builds the [`Failover`] channel for `Client::connect_with_balanced_channel`.
pub(crate) struct FailoverBuilder;

impl BalancedChannelBuilder for FailoverBuilder {
    type Error = etcd_client::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(Channel, mpsc::Sender<Change<Uri, Endpoint>>), Self::Error> {
        let (updates, changes) = mpsc::channel(buffer_size);
        let failover = Failover {
            state: Arc::new(Mutex::new(State {
                changes,
                members: Vec::new(),
                current: 0,
            })),
        };
        Ok((Channel::Custom(BoxCloneSyncService::new(failover)), updates))
    }
}

#[derive(Clone)]
pub(crate) struct Failover {
    state: Arc<Mutex<State>>,
}

struct State {
    /// Members the client adds (at connect) or removes, applied before each request.
    changes: Changes,
    /// Each member's lazily connected channel (it reconnects by itself when the member is back).
    members: Vec<(Uri, tonic::transport::Channel)>,
    /// The member requests go to.
    current: usize,
}

impl State {
    fn apply_changes(&mut self) {
        while let Ok(change) = self.changes.try_recv() {
            match change {
                Change::Insert(uri, endpoint) => {
                    self.members.retain(|(known, _)| *known != uri);
                    self.members.push((uri, endpoint.connect_lazy()));
                }
                Change::Remove(uri) => self.members.retain(|(known, _)| *known != uri),
            }
        }
        if self.current >= self.members.len() {
            self.current = 0;
        }
    }
}

impl Failover {
    /// The member to use now: its position and channel.
    fn pick(&self) -> Option<(usize, tonic::transport::Channel)> {
        let mut state = self.state.lock().expect("failover state");
        state.apply_changes();
        let current = state.current;
        state
            .members
            .get(current)
            .map(|(_, channel)| (current, channel.clone()))
    }

    /// A request to member `index` failed in transport: later ones go to the next member
    /// (unless another request moved on already).
    fn failed(&self, index: usize) {
        let mut state = self.state.lock().expect("failover state");
        if state.current != index || state.members.len() < 2 {
            return;
        }
        state.current = (index + 1) % state.members.len();
        tracing::warn!(
            failed = %state.members[index].0,
            next = %state.members[state.current].0,
            "etcd member unreachable: moving to the next"
        );
    }
}

impl Service<Request> for Failover {
    type Response = Response;
    type Error = tower::BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, tower::BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each member's channel is made ready when the request is sent to it.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let picked = self.pick();
        let failover = self.clone();
        Box::pin(async move {
            let Some((index, channel)) = picked else {
                return Err("no etcd endpoint configured".into());
            };
            let sent = async { channel.ready_oneshot().await?.call(request).await }.await;
            if sent.is_err() {
                failover.failed(index);
            }
            sent.map_err(Into::into)
        })
    }
}

/// Whether `error` says etcd could not be reached or could not answer now (transport, or
/// etcd's own "unavailable": no leader, leader changed), as opposed to an answer.
pub(crate) fn unavailable(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            // A transport failure surfaces as a status with the transport error as its source.
            status.code() == tonic::Code::Unavailable || std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

/// Whether `error` means the request never left this process: no connection to the member
/// could be made (it is down). Only such a request is safe to send again as it is: one that
/// may have reached etcd could have been applied.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(error) => Some(error),
        etcd_client::Error::IoError(error) => Some(error),
        _ => None,
    };
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        {
            return true;
        }
        source = current.source();
    }
    false
}

/// A node's etcd client: requests go through [`Failover`], and one that could not be sent at
/// all (its member is down) goes again to the next member, once per member. Anything else,
/// including a request that may have reached etcd, is the caller's to handle: it is never
/// repeated here.
#[derive(Clone)]
pub(crate) struct Etcd {
    client: etcd_client::Client,
    members: usize,
}

impl Etcd {
    pub(crate) async fn connect(
        endpoints: &[String],
        options: etcd_client::ConnectOptions,
    ) -> Result<Etcd, etcd_client::Error> {
        let client = etcd_client::Client::connect_with_balanced_channel(
            endpoints,
            Some(options),
            FailoverBuilder,
        )
        .await?;
        Ok(Etcd {
            client,
            members: endpoints.len(),
        })
    }

    /// The client itself, for streams and leases (their loops retry by themselves).
    pub(crate) fn raw(&self) -> etcd_client::Client {
        self.client.clone()
    }

    async fn send<T, F, Fut>(&self, request: F) -> Result<T, etcd_client::Error>
    where
        F: Fn(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempts = 1;
        loop {
            match request(self.client.clone()).await {
                Err(error) if attempts < self.members && never_sent(&error) => attempts += 1,
                result => return result,
            }
        }
    }

    pub(crate) async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<etcd_client::GetOptions>,
    ) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        let key = key.into();
        self.send(|mut client| {
            let (key, options) = (key.clone(), options.clone());
            async move { client.get(key, options).await }
        })
        .await
    }

    pub(crate) async fn txn(
        &self,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
        self.send(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<etcd_client::PutOptions>,
    ) -> Result<etcd_client::PutResponse, etcd_client::Error> {
        let (key, value) = (key.into(), value.into());
        self.send(|mut client| {
            let (key, value, options) = (key.clone(), value.clone(), options.clone());
            async move { client.put(key, value, options).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::EtcdServer;

    /// A loopback port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    #[test]
    fn a_dead_member_first_in_the_list_costs_no_request() {
        let etcd = EtcdServer::start();
        let dead = format!("http://127.0.0.1:{}", closed_port());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let options = etcd_client::ConnectOptions::new();
            // Alone, the dead member's failure says the request never left.
            let alone = Etcd::connect(std::slice::from_ref(&dead), options.clone())
                .await
                .unwrap();
            let error = alone.get("k", None).await.expect_err("nobody listens");
            assert!(never_sent(&error), "{error}");
            // Listed first, it costs nothing: the request goes on to the live member, and so
            // do all after it.
            let both = Etcd::connect(&[dead, etcd.endpoint.clone()], options)
                .await
                .unwrap();
            both.put("k", "v", None)
                .await
                .expect("sent on to the live member");
            // Pinned there: even requests nothing would send again (streams, leases) reach it.
            for _ in 0..20 {
                let read = both.raw().get("k", None).await.expect("the live member");
                assert_eq!(read.kvs()[0].value(), b"v");
            }
        });
    }
}
