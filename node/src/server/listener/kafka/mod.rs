//! The Kafka listener (DESIGN §11): existing Kafka clients produce, fetch, list offsets,
//! consume in groups and administer the cluster through Kafka's own protocol.
//!
//! One handler per API family, each with its authorization inside (as Redpanda's
//! `kafka/server/handlers/`): `data` (Metadata, Produce, Fetch, ListOffsets), `groups` (classic
//! groups, offsets, FindCoordinator), `consumer_groups` (KIP-848), `transactions` (with
//! InitProducerId), `admin` (topics, configs, groups), `cluster_admin`, `partition_admin`,
//! `security_admin` (ACLs, SCRAM), `quotas`, `share_groups` (KIP-932's members: heartbeats,
//! fetches, acknowledgements) and `share_admin` (share groups' offsets, and what the group
//! APIs need of share groups). This module is the protocol around them:
//! decoding, authentication, quotas, and the dispatch to a family (`serve_request`).
//!
//! Each shard accepts on the Kafka address (SO_REUSEPORT, like the shared client port). A
//! request is decoded (`strata_kafka::frame`), translated into the native request
//! (`strata_kafka::translate`) and run through the same handler native clients reach
//! ([`Shard::handle`]: partitions of other shards are forwarded as usual); the native answer
//! is translated back. Kafka clients are not shard-aware and are told only the broker's Kafka
//! address, so a partition of another shard costs a cross-shard hop.
//!
//! Responses leave in request order, as Kafka's clients expect (the Java client checks each
//! answer against its oldest request), while the requests themselves run concurrently. A
//! produce with acks=0 gets no answer, as in Kafka. A frame over the size limit or a request
//! that does not decode closes the connection with a logged reason, as Kafka's brokers do. A
//! request of an API or version not served is counted by API key and answered
//! UNSUPPORTED_VERSION in its own response (`strata_kafka::refusal`), so an operator's tool
//! fails with a clear error; an ApiVersions request of a version not served is answered
//! (version 0, with the versions served) so the client can pick one (KIP-511).

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use strata_coordinator::quotas::QuotaKey;
use strata_kafka::errors;
use strata_kafka::frame::{self, Header, KafkaRequest, Rejected};
use strata_kafka::kafka_protocol::messages::ApiKey;
use strata_kafka::translate::{self, KafkaBroker};
use strata_wire::protocol::{ErrorCode, Request, Response};
use tokio::task::JoinHandle;

mod admin;
mod authorize;
mod cluster_admin;
mod consumer_groups;
mod data;
mod groups;
mod partition_admin;
mod quotas;
mod security_admin;
mod share_admin;
pub(crate) mod share_groups;
mod transactions;

use super::quota;
use super::sasl::{self, SaslSession};
use super::{Authentication, Client, Decoded, Endpoint, Outcome, Protocol};
use crate::server::shard::Shard;

/// Binds each Kafka listener (every shard, SO_REUSEPORT).
pub(super) fn listen(
    shard: &Rc<Shard>,
    auth: &Rc<Authentication>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut accepting = Vec::new();
    for spec in &shard.context.config.kafka {
        let endpoint = Endpoint::new(shard, *spec, auth.clone())?;
        let listener = super::bind(spec.address, true)?;
        accepting.push(super::accept::<Kafka>(shard.clone(), listener, endpoint));
    }
    Ok(accepting)
}

pub(super) struct Kafka;

impl Protocol for Kafka {
    type Header = Header;
    type Request = KafkaRequest;
    const NAME: &'static str = "kafka";
    const IN_FLIGHT: usize = 64;
    const IN_ORDER: bool = true;
    const BIG_ENDIAN: bool = true;
    const HEAD_LEN: usize = 0;
    const MIN_FRAME_LEN: usize = 0;

    fn count_connection(shard: &Shard, delta: i64) {
        shard.metrics.kafka_connections(delta);
    }

    fn refuse_frame(len: usize, _max: usize, _head: Option<&[u8]>) -> (Option<Outcome>, String) {
        (None, format!("a frame of {len} bytes, over the size limit"))
    }

    fn decode(
        shard: &Shard,
        session: &SaslSession,
        client: &Client,
        body: BytesMut,
    ) -> Decoded<Kafka> {
        let peer = client.peer;
        if session.unframed() {
            // A bare token of a version-0 handshake's exchange: given to the same step as
            // SaslAuthenticate's, and answered bare.
            let header = Header {
                api_key: ApiKey::SaslAuthenticate,
                api_version: 0,
                correlation_id: 0,
                client_id: String::new(),
                throttle_ms: 0,
            };
            let request =
                strata_kafka::kafka_protocol::messages::SaslAuthenticateRequest::default()
                    .with_auth_bytes(body.freeze());
            return Decoded::Authenticate(header, KafkaRequest::SaslAuthenticate(request));
        }
        shard.metrics.kafka_request();
        let body = body.freeze();
        // The frame goes to the decoder as its only holder (a produce's records are detached
        // from it in place), but for a refusal, which reads it.
        let (decoded, body) = match frame::unsupported(&body) {
            Some(rejected) => (Err(rejected), body),
            None => (frame::decode_request(body), Bytes::new()),
        };
        match decoded {
            Ok(decoded) => {
                if decoded.trailing_bytes > 0 {
                    shard.metrics.kafka_request_with_trailing_bytes();
                    tracing::trace!(%peer, api = ?decoded.header.api_key, bytes = decoded.trailing_bytes, "bytes after a kafka request, ignored");
                }
                if matches!(
                    decoded.request,
                    KafkaRequest::SaslHandshake(_) | KafkaRequest::SaslAuthenticate(_)
                ) {
                    return Decoded::Authenticate(decoded.header, decoded.request);
                }
                if decoded.header.api_key != ApiKey::ApiVersions
                    && let Err(why) = session.admit(shard.context.config.clock.now())
                {
                    return Decoded::Close(None, format!("{:?} {why}", decoded.header.api_key));
                }
                let mut header = decoded.header;
                if let KafkaRequest::Produce(produce) = &decoded.request {
                    let bytes = produce.records_len();
                    let wait = quota::charge_produce(shard, client, &header.client_id, bytes);
                    header.throttle_ms = millis(wait);
                }
                Decoded::Request(header, decoded.request)
            }
            Err(Rejected::Unsupported {
                api_key,
                api_version,
                correlation_id,
            }) if api_key == ApiKey::ApiVersions as i16 => {
                tracing::debug!(%peer, api_version, "ApiVersions of a version not served: answered with the versions served");
                let header = Header {
                    api_key: ApiKey::ApiVersions,
                    api_version: 0,
                    correlation_id,
                    client_id: String::new(),
                    throttle_ms: 0,
                };
                let response = translate::api_versions_response(errors::UNSUPPORTED_VERSION);
                Decoded::Answered(encoded(&header, response))
            }
            Err(Rejected::Unsupported {
                api_key,
                api_version,
                correlation_id,
            }) => {
                shard.metrics.kafka_unsupported_request(api_key);
                if let Err(why) = session.admit(shard.context.config.clock.now()) {
                    return Decoded::Close(None, format!("api key {api_key} {why}"));
                }
                let api = ApiKey::try_from(api_key)
                    .map_or_else(|_| format!("api key {api_key}"), |api| format!("{api:?}"));
                match strata_kafka::refusal::unsupported_version_answer(
                    api_key,
                    api_version,
                    correlation_id,
                    &body,
                ) {
                    Some(refusal) => {
                        tracing::debug!(%peer, api, api_version, "a request not served: answered UNSUPPORTED_VERSION");
                        Decoded::Answered(answer(vec![refusal.freeze()]))
                    }
                    None => Decoded::Close(
                        None,
                        format!(
                            "{api} v{api_version} is not served, and its answer has no place for UNSUPPORTED_VERSION"
                        ),
                    ),
                }
            }
            Err(rejected @ Rejected::Malformed(_)) => Decoded::Close(None, rejected.to_string()),
        }
    }

    async fn authenticate(
        shard: &Rc<Shard>,
        endpoint: &Endpoint,
        session: &mut SaslSession,
        client: &mut Client,
        header: Header,
        request: KafkaRequest,
    ) -> Decoded<Kafka> {
        authenticate(shard, endpoint, session, client, header, request).await
    }

    async fn respond(
        shard: Rc<Shard>,
        client: Client,
        header: &Header,
        request: KafkaRequest,
    ) -> Outcome {
        respond(&shard, &client, header.clone(), request).await
    }

    fn panicked(_header: &Header) -> Outcome {
        Outcome::Close("a request handler panicked".into())
    }
}

/// A Kafka answer for the writer. Its chunks are all in memory (Kafka's batches are re-encoded,
/// never sent from files), so empty ones, which the writer would take for records from a
/// file, are dropped.
fn answer(mut chunks: Vec<Bytes>) -> Outcome {
    chunks.retain(|chunk| !chunk.is_empty());
    Outcome::Answer(chunks.into())
}

/// Encodes `response`, reporting the throttle the header carries.
fn encoded<R: strata_kafka::kafka_protocol::protocol::Encodable + frame::Throttled>(
    header: &Header,
    mut response: R,
) -> Outcome {
    response.set_throttle_time_ms(header.throttle_ms);
    match frame::encode_response(header, &response) {
        Ok(frame) => answer(vec![frame.freeze()]),
        Err(error) => Outcome::Close(format!("a response did not encode: {error}")),
    }
}

/// The native handler answered with something other than what the request asks for.
fn unanswered(api: &str, answer: Result<Response, ErrorCode>) -> Outcome {
    let answer = match answer {
        Ok(response) => format!("{:?}", response.api_key()),
        Err(code) => code.to_string(),
    };
    Outcome::Close(format!("{api} got no native answer ({answer})"))
}

/// Runs a SaslHandshake or SaslAuthenticate (see [`sasl`]): answered and read on, or, when it
/// fails, answered after the failed-authentication delay and closed.
async fn authenticate(
    shard: &Rc<Shard>,
    endpoint: &Endpoint,
    session: &mut SaslSession,
    client: &mut Client,
    header: Header,
    request: KafkaRequest,
) -> Decoded<Kafka> {
    use strata_kafka::kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
    let security = &shard.context.config.security;
    match request {
        KafkaRequest::SaslHandshake(request) => {
            let offered: Vec<_> = if endpoint.spec.protocol.uses_sasl() {
                security.sasl_mechanisms.clone()
            } else {
                Vec::new()
            };
            let names = offered
                .iter()
                .map(|mechanism| mechanism.name().to_string().into())
                .collect();
            let chosen = session.handle_handshake(
                header.api_version,
                &request.mechanism,
                &offered,
                crate::server::security::random_nonce(18),
                endpoint.auth.unknown_user_key,
            );
            let error_code = chosen.err().unwrap_or(errors::NONE);
            let answer = encoded(
                &header,
                SaslHandshakeResponse::default()
                    .with_error_code(error_code)
                    .with_mechanisms(names),
            );
            if error_code == errors::NONE {
                Decoded::Answered(answer)
            } else {
                Decoded::Close(
                    Some(answer),
                    format!(
                        "SaslHandshake for {:?} refused (error {error_code})",
                        request.mechanism.as_str()
                    ),
                )
            }
        }
        KafkaRequest::SaslAuthenticate(request) => {
            let unframed = session.unframed();
            // The answer to a bare token is a bare token.
            let reply = |response: SaslAuthenticateResponse| {
                if unframed {
                    let mut frame = BytesMut::with_capacity(4 + response.auth_bytes.len());
                    frame.extend_from_slice(&(response.auth_bytes.len() as u32).to_be_bytes());
                    frame.extend_from_slice(&response.auth_bytes);
                    answer(vec![frame.freeze()])
                } else {
                    encoded(&header, response)
                }
            };
            let response = SaslAuthenticateResponse::default();
            match sasl::step(shard, endpoint, session, client, &request.auth_bytes).await {
                sasl::Step::Continue(bytes) => {
                    Decoded::Answered(reply(response.with_auth_bytes(bytes.into())))
                }
                sasl::Step::Authenticated { bytes, lifetime_ms } => Decoded::Answered(reply(
                    response
                        .with_auth_bytes(bytes.into())
                        .with_session_lifetime_ms(lifetime_ms),
                )),
                sasl::Step::Failed { mechanism, why } => {
                    let message = format!(
                        "Authentication failed: invalid credentials with SASL mechanism {mechanism}"
                    );
                    // A bare exchange has no way to say why: the connection just closes.
                    let refusal = (!unframed).then(|| {
                        encoded(
                            &header,
                            response
                                .with_error_code(errors::SASL_AUTHENTICATION_FAILED)
                                .with_error_message(Some(message.into())),
                        )
                    });
                    Decoded::Close(refusal, format!("SASL authentication failed: {why}"))
                }
            }
        }
        _ => Decoded::Close(None, "an authentication step that is not one".into()),
    }
}

/// Answers a request under the client's quotas: an answer reports how long the client must
/// wait (`throttle_time_ms`: the longest of its quotas' waits) and the connection is not read
/// until then. The request-time quota is decided by the time the client's earlier requests
/// took (this one's is known only once it is answered) and counts the time the shard spent
/// inside the request's handler.
async fn respond(
    shard: &Rc<Shard>,
    client: &Client,
    mut header: Header,
    request: KafkaRequest,
) -> Outcome {
    let exempt = matches!(
        request,
        KafkaRequest::ApiVersions(_)
            | KafkaRequest::SaslHandshake(_)
            | KafkaRequest::SaslAuthenticate(_)
    );
    let client_id = header.client_id.clone();
    let charge = quota::Charge::new(shard, client, &client_id);
    let timed = !exempt && charge.governs(QuotaKey::RequestPercentage).is_some();
    if !timed {
        return serve_request(shard, client, &charge, header, request).await;
    }
    let now = shard.context.config.clock.now();
    let wait = charge.throttle(QuotaKey::RequestPercentage, now);
    charge.hold(QuotaKey::RequestPercentage, wait, now);
    header.throttle_ms = header.throttle_ms.max(millis(wait));
    let (outcome, spent) =
        quota::timed(serve_request(shard, client, &charge, header, request)).await;
    let now = shard.context.config.clock.now();
    charge.record(
        QuotaKey::RequestPercentage,
        quota::request_share(spent),
        now,
    );
    outcome
}

/// A wait in Kafka's `throttle_time_ms`.
fn millis(wait: std::time::Duration) -> i32 {
    i32::try_from(wait.as_millis()).unwrap_or(i32::MAX)
}

/// Runs a request through its API family's handler, which checks the client's authorization and
/// answers in Kafka's terms (an `acks=0` produce gets no answer).
async fn serve_request(
    shard: &Rc<Shard>,
    client: &Client,
    charge: &quota::Charge<'_>,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    use KafkaRequest as K;
    match request {
        K::ApiVersions(_) => encoded(&header, translate::api_versions_response(errors::NONE)),
        K::SaslHandshake(_) | K::SaslAuthenticate(_) => {
            Outcome::Close("an authentication step outside the reader".into())
        }
        request @ (K::Metadata(_) | K::Produce(_) | K::Fetch(_) | K::ListOffsets(_)) => {
            data::serve(shard, client, charge, header, request).await
        }
        request @ (K::FindCoordinator(_)
        | K::JoinGroup(_)
        | K::SyncGroup(_)
        | K::Heartbeat(_)
        | K::LeaveGroup(_)
        | K::OffsetCommit(_)
        | K::OffsetFetch(_)) => groups::serve(shard, client, header, request).await,
        request @ (K::ConsumerGroupHeartbeat(_) | K::ConsumerGroupDescribe(_)) => {
            consumer_groups::serve(shard, client, header, request).await
        }
        request @ (K::InitProducerId(_)
        | K::AddPartitionsToTxn(_)
        | K::AddOffsetsToTxn(_)
        | K::EndTxn(_)
        | K::TxnOffsetCommit(_)
        | K::DescribeTransactions(_)
        | K::ListTransactions(_)) => transactions::serve(shard, client, header, request).await,
        request @ (K::CreateTopics(_)
        | K::DeleteTopics(_)
        | K::CreatePartitions(_)
        | K::DescribeConfigs(_)
        | K::AlterConfigs(_)
        | K::IncrementalAlterConfigs(_)
        | K::ListGroups(_)
        | K::DescribeGroups(_)
        | K::DeleteGroups(_)
        | K::OffsetDelete(_)) => admin::serve(shard, client, header, request).await,
        request @ (K::DescribeCluster(_)
        | K::DescribeTopicPartitions(_)
        | K::ListPartitionReassignments(_)
        | K::AlterPartitionReassignments(_)
        | K::ElectLeaders(_)) => cluster_admin::serve(shard, client, header, request).await,
        request @ (K::OffsetForLeaderEpoch(_)
        | K::DescribeLogDirs(_)
        | K::DescribeProducers(_)
        | K::DeleteRecords(_)) => partition_admin::serve(shard, client, header, request).await,
        request @ (K::CreateAcls(_)
        | K::DescribeAcls(_)
        | K::DeleteAcls(_)
        | K::DescribeUserScramCredentials(_)
        | K::AlterUserScramCredentials(_)) => {
            security_admin::serve(shard, client, header, request).await
        }
        request @ (K::DescribeClientQuotas(_) | K::AlterClientQuotas(_)) => {
            quotas::serve(shard, client, header, request).await
        }
        request @ (K::ShareGroupHeartbeat(_)
        | K::ShareGroupDescribe(_)
        | K::ShareFetch(_)
        | K::ShareAcknowledge(_)) => share_groups::serve(shard, client, header, request).await,
        request @ (K::DescribeShareGroupOffsets(_)
        | K::AlterShareGroupOffsets(_)
        | K::DeleteShareGroupOffsets(_)) => {
            share_admin::serve(shard, client, header, request).await
        }
    }
}

async fn native(shard: &Rc<Shard>, request: Request) -> Result<Response, ErrorCode> {
    shard
        .handle(request)
        .await
        .unwrap_or(Err(ErrorCode::Internal))
}

/// The brokers a Kafka client can reach: those with a Kafka listener, at their advertised host.
fn kafka_brokers(shard: &Shard, client: &Client) -> Vec<KafkaBroker> {
    let view = shard.view.borrow();
    view.brokers
        .iter()
        .filter_map(|broker| {
            Some(KafkaBroker {
                node_id: broker.id,
                host: broker.host.clone(),
                port: kafka_port(broker, client)?,
                rack: broker.rack.clone(),
            })
        })
        .collect()
}

/// Where `broker` takes Kafka clients like `client`: its listener of the same name as the one
/// `client` connected through (Kafka's rule), or, for a broker that advertises no names, its
/// one Kafka port.
pub(super) fn kafka_port(broker: &strata_coordinator::BrokerInfo, client: &Client) -> Option<u16> {
    if broker.kafka_listeners.is_empty() {
        return broker.kafka_port;
    }
    let name = client.listener.protocol.name();
    broker
        .kafka_listeners
        .iter()
        .find(|listener| listener.name == name)
        .map(|listener| listener.port)
}

/// A topic's id as Kafka's clients read it.
pub(super) fn kafka_topic_id(topic: &strata_coordinator::TopicState) -> uuid::Uuid {
    uuid::Uuid::from_bytes(topic.topic_id().0)
}
