//! The replication listener: followers' fetches over QUIC, one bidirectional stream per
//! request, answered by the leader side of [`crate::server::replica`].
//!
//! A stream whose request does not decode, or that is not a replication request, is reset
//! with a logged reason; the connection and its other streams go on.

use std::rc::Rc;

use strata_wire::protocol::{Request, Response};
use tokio::task::JoinHandle;

use crate::server::quic;
use crate::server::shard::Shard;

/// Accepts peers' QUIC connections on this shard's replication endpoint, when it has one.
pub(super) fn listen(shard: &Rc<Shard>) -> Option<JoinHandle<()>> {
    let endpoint = shard.quic.as_ref()?.endpoint().clone();
    let shard = shard.clone();
    Some(tokio::task::spawn_local(async move {
        while let Some(incoming) = endpoint.accept().await {
            let shard = shard.clone();
            tokio::task::spawn_local(async move {
                let connection = match incoming.await {
                    Ok(connection) => connection,
                    Err(error) => {
                        tracing::debug!("replication handshake failed: {error}");
                        return;
                    }
                };
                let peer = connection.remote_address();
                while let Ok((send, receive)) = connection.accept_bi().await {
                    tokio::task::spawn_local(answer(shard.clone(), peer, send, receive));
                }
            });
        }
    }))
}

/// Answers one stream's request.
async fn answer(
    shard: Rc<Shard>,
    peer: std::net::SocketAddr,
    mut send: quinn::SendStream,
    mut receive: quinn::RecvStream,
) {
    let max = shard.context.config.max_frame_bytes;
    let (correlation_id, request) = match quic::read_request(&mut receive, max).await {
        Ok(request) => request,
        Err(reason) => {
            tracing::warn!(%peer, "closing replication stream: {reason}");
            let _ = send.reset(1u32.into());
            return;
        }
    };
    let response = match request {
        Request::ReplicaFetch(request) => {
            Response::ReplicaFetch(shard.replica_fetch(request).await)
        }
        // A peer coordinating a transaction: this broker writes only what it leads.
        Request::WriteTxnMarkers(request) => {
            Response::WriteTxnMarkers(shard.write_txn_markers(request, false).await)
        }
        // A peer's group coordinator measuring lag reads partitions this broker leads.
        Request::ListOffsets(request) => Response::ListOffsets(shard.list_offsets(request).await),
        Request::Fetch(request) => Response::Fetch(shard.peer_fetch(request).await),
        other => {
            tracing::warn!(%peer, api = ?other.api_key(), "closing replication stream: not a replication request");
            let _ = send.reset(1u32.into());
            return;
        }
    };
    quic::write_response(&mut send, response.encode(correlation_id)).await;
}
