//! The Kafka listener (DESIGN §11): existing Kafka clients produce, fetch, list offsets,
//! consume in groups (`groups.rs`) and administer topics (`admin.rs`) through Kafka's own
//! protocol.
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
use strata_auth::acl::Operation;
use strata_coordinator::quotas::QuotaKey;
use strata_kafka::errors;
use strata_kafka::frame::{self, Header, KafkaRequest, Rejected};
use strata_kafka::kafka_protocol::messages::{
    ApiKey, FetchResponse, HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse,
    SyncGroupResponse, TopicName,
};
use strata_kafka::translate::{self, KafkaBroker};
use strata_wire::protocol::{ErrorCode, Request, Response};
use tokio::task::JoinHandle;

mod admin;
mod authorize;
mod cluster_admin;
mod consumer_groups;
mod groups;
mod partition_admin;
mod quotas;
mod security_admin;
mod transactions;

use super::quota;
use super::sasl::{self, SaslSession};
use super::{Authentication, Client, Decoded, Endpoint, Outcome, Protocol};
use crate::server::messages::Delivery;
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

/// Runs a request through the native handler and answers it in Kafka's terms; `None` when no
/// answer is due (acks=0).
async fn serve_request(
    shard: &Rc<Shard>,
    client: &Client,
    charge: &quota::Charge<'_>,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::ApiVersions(_) => {
            encoded(&header, translate::api_versions_response(errors::NONE))
        }
        KafkaRequest::Metadata(request) => metadata(shard, client, header, request).await,
        KafkaRequest::Produce(request) => produce(shard, client, header, request).await,
        KafkaRequest::Fetch(request) => fetch(shard, client, charge, header, request).await,
        KafkaRequest::ListOffsets(request) => list_offsets(shard, client, header, request).await,
        request @ (KafkaRequest::AddPartitionsToTxn(_)
        | KafkaRequest::AddOffsetsToTxn(_)
        | KafkaRequest::EndTxn(_)
        | KafkaRequest::TxnOffsetCommit(_)
        | KafkaRequest::DescribeTransactions(_)
        | KafkaRequest::ListTransactions(_)) => {
            respond_transactions(shard, client, header, request).await
        }
        KafkaRequest::InitProducerId(request) => {
            init_producer_id(shard, client, header, request).await
        }
        KafkaRequest::FindCoordinator(request) => encoded(
            &header,
            groups::find_coordinator(shard, client, &header, request).await,
        ),
        KafkaRequest::JoinGroup(request) => {
            if !authorize::group(shard, client, Operation::Read, &request.group_id) {
                let refused = JoinGroupResponse::default()
                    .with_error_code(errors::GROUP_AUTHORIZATION_FAILED)
                    .with_generation_id(-1);
                return encoded(&header, refused);
            }
            encoded(&header, groups::join(shard, &header, request).await)
        }
        KafkaRequest::SyncGroup(request) => {
            if !authorize::group(shard, client, Operation::Read, &request.group_id) {
                let refused = SyncGroupResponse::default()
                    .with_error_code(errors::GROUP_AUTHORIZATION_FAILED);
                return encoded(&header, refused);
            }
            encoded(&header, groups::sync(shard, request).await)
        }
        KafkaRequest::Heartbeat(request) => {
            if !authorize::group(shard, client, Operation::Read, &request.group_id) {
                let refused = HeartbeatResponse::default()
                    .with_error_code(errors::GROUP_AUTHORIZATION_FAILED);
                return encoded(&header, refused);
            }
            encoded(&header, groups::heartbeat(shard, request).await)
        }
        KafkaRequest::LeaveGroup(request) => {
            if !authorize::group(shard, client, Operation::Read, &request.group_id) {
                let refused = LeaveGroupResponse::default()
                    .with_error_code(errors::GROUP_AUTHORIZATION_FAILED);
                return encoded(&header, refused);
            }
            encoded(&header, groups::leave(shard, &header, request).await)
        }
        KafkaRequest::OffsetCommit(request) => {
            encoded(&header, groups::commit(shard, client, request).await)
        }
        KafkaRequest::ConsumerGroupHeartbeat(request) => {
            let client_id = header.client_id.clone();
            encoded(
                &header,
                consumer_groups::consumer_group_heartbeat(shard, client, &client_id, request).await,
            )
        }
        KafkaRequest::ConsumerGroupDescribe(request) => encoded(
            &header,
            consumer_groups::consumer_group_describe(shard, client, request).await,
        ),
        KafkaRequest::OffsetFetch(request) => {
            encoded(&header, groups::fetch_offsets(shard, client, request).await)
        }
        KafkaRequest::ListGroups(request) => {
            encoded(&header, admin::list_groups(shard, client, request).await)
        }
        KafkaRequest::DeleteGroups(request) => {
            encoded(&header, admin::delete_groups(shard, client, request).await)
        }
        KafkaRequest::DescribeGroups(request) => encoded(
            &header,
            admin::describe_groups(shard, client, request).await,
        ),
        KafkaRequest::CreateTopics(request) => {
            encoded(&header, admin::create_topics(shard, client, request).await)
        }
        KafkaRequest::DeleteTopics(request) => {
            let version = header.api_version;
            encoded(
                &header,
                admin::delete_topics(shard, client, version, request).await,
            )
        }
        KafkaRequest::CreatePartitions(request) => encoded(
            &header,
            admin::create_partitions(shard, client, request).await,
        ),
        KafkaRequest::DescribeConfigs(request) => encoded(
            &header,
            admin::describe_configs(shard, client, request).await,
        ),
        KafkaRequest::AlterConfigs(request) => {
            encoded(&header, admin::alter_configs(shard, client, request).await)
        }
        KafkaRequest::IncrementalAlterConfigs(request) => encoded(
            &header,
            admin::incremental_alter_configs(shard, client, request).await,
        ),
        request @ (KafkaRequest::CreateAcls(_)
        | KafkaRequest::DescribeAcls(_)
        | KafkaRequest::DeleteAcls(_)
        | KafkaRequest::DescribeUserScramCredentials(_)
        | KafkaRequest::AlterUserScramCredentials(_)
        | KafkaRequest::DescribeCluster(_)
        | KafkaRequest::DescribeTopicPartitions(_)
        | KafkaRequest::ListPartitionReassignments(_)
        | KafkaRequest::AlterPartitionReassignments(_)
        | KafkaRequest::ElectLeaders(_)
        | KafkaRequest::OffsetForLeaderEpoch(_)
        | KafkaRequest::DescribeLogDirs(_)
        | KafkaRequest::DescribeProducers(_)
        | KafkaRequest::DeleteRecords(_)
        | KafkaRequest::OffsetDelete(_)
        | KafkaRequest::DescribeClientQuotas(_)
        | KafkaRequest::AlterClientQuotas(_)) => {
            respond_cluster_admin(shard, client, header, request).await
        }
        KafkaRequest::SaslHandshake(_) | KafkaRequest::SaslAuthenticate(_) => {
            Outcome::Close("an authentication step outside the reader".into())
        }
    }
}

/// InitProducerId: an idempotent producer's id, for a client allowed to write idempotently.
async fn init_producer_id(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: strata_kafka::kafka_protocol::messages::InitProducerIdRequest,
) -> Outcome {
    let answered = match translate::init_producer_id_request(&request) {
        Err(error) => Err(error),
        Ok(request)
            if request.transactional.0.as_ref().is_some_and(|txn| {
                !authorize::transactional_id(shard, client, Operation::Write, &txn.transactional_id)
            }) =>
        {
            Err(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        }
        Ok(request)
            if request.transactional.0.is_none() && !client.may_write_idempotently(shard) =>
        {
            Err(errors::CLUSTER_AUTHORIZATION_FAILED)
        }
        Ok(request) => match native(shard, Request::InitProducerId(request)).await {
            Ok(Response::InitProducerId(native)) => Ok(native),
            Err(code) => Err(errors::kafka_error(code)),
            Ok(other) => {
                tracing::warn!(?other, "init-producer-id got another answer");
                Err(errors::UNKNOWN_SERVER_ERROR)
            }
        },
    };
    encoded(&header, translate::init_producer_id_response(answered))
}

/// The transaction APIs (`transactions`).
async fn respond_transactions(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::AddPartitionsToTxn(request) => encoded(
            &header,
            transactions::add_partitions_to_txn(shard, client, request).await,
        ),
        KafkaRequest::AddOffsetsToTxn(request) => encoded(
            &header,
            transactions::add_offsets_to_txn(shard, client, request).await,
        ),
        KafkaRequest::EndTxn(request) => {
            encoded(&header, transactions::end_txn(shard, client, request).await)
        }
        KafkaRequest::TxnOffsetCommit(request) => encoded(
            &header,
            transactions::txn_offset_commit(shard, client, request).await,
        ),
        KafkaRequest::DescribeTransactions(request) => encoded(
            &header,
            transactions::describe_transactions(shard, client, request).await,
        ),
        KafkaRequest::ListTransactions(request) => encoded(
            &header,
            transactions::list_transactions(shard, client, request).await,
        ),
        _ => unreachable!("only the transaction APIs come here"),
    }
}

/// The cluster, partition and security administration APIs (`cluster_admin`,
/// `partition_admin`, `quotas`, `security_admin`).
async fn respond_cluster_admin(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::CreateAcls(request) => encoded(
            &header,
            security_admin::create_acls(shard, client, request).await,
        ),
        KafkaRequest::DescribeAcls(request) => encoded(
            &header,
            security_admin::describe_acls(shard, client, request),
        ),
        KafkaRequest::DeleteAcls(request) => encoded(
            &header,
            security_admin::delete_acls(shard, client, request).await,
        ),
        KafkaRequest::DescribeUserScramCredentials(request) => encoded(
            &header,
            security_admin::describe_user_scram_credentials(shard, client, request),
        ),
        KafkaRequest::AlterUserScramCredentials(request) => encoded(
            &header,
            security_admin::alter_user_scram_credentials(shard, client, request).await,
        ),
        KafkaRequest::DescribeCluster(request) => encoded(
            &header,
            cluster_admin::describe_cluster(shard, client, request),
        ),
        KafkaRequest::DescribeTopicPartitions(request) => encoded(
            &header,
            cluster_admin::describe_topic_partitions(shard, client, request),
        ),
        KafkaRequest::ListPartitionReassignments(request) => encoded(
            &header,
            cluster_admin::list_partition_reassignments(shard, client, request),
        ),
        KafkaRequest::AlterPartitionReassignments(request) => encoded(
            &header,
            cluster_admin::alter_partition_reassignments(shard, client, request).await,
        ),
        KafkaRequest::ElectLeaders(request) => {
            let version = header.api_version;
            encoded(
                &header,
                cluster_admin::elect_leaders(shard, client, version, request).await,
            )
        }
        KafkaRequest::OffsetForLeaderEpoch(request) => encoded(
            &header,
            partition_admin::offset_for_leader_epoch(shard, client, request).await,
        ),
        KafkaRequest::DescribeLogDirs(request) => encoded(
            &header,
            partition_admin::describe_log_dirs(shard, client, request).await,
        ),
        KafkaRequest::DescribeProducers(request) => encoded(
            &header,
            partition_admin::describe_producers(shard, client, request).await,
        ),
        KafkaRequest::DeleteRecords(request) => encoded(
            &header,
            partition_admin::delete_records(shard, client, request).await,
        ),
        KafkaRequest::OffsetDelete(request) => {
            encoded(&header, admin::offset_delete(shard, client, request).await)
        }
        KafkaRequest::DescribeClientQuotas(request) => encoded(
            &header,
            quotas::describe_client_quotas(shard, client, request),
        ),
        KafkaRequest::AlterClientQuotas(request) => encoded(
            &header,
            quotas::alter_client_quotas(shard, client, request).await,
        ),
        _ => unreachable!("only the cluster administration APIs come here"),
    }
}

/// Metadata: the topics the client may Describe, created on first use where allowed.
async fn metadata(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    mut request: strata_kafka::kafka_protocol::messages::MetadataRequest,
) -> Outcome {
    // Topics asked for by id (KIP-516: a KIP-848 consumer resolves its assignment so) are
    // named from the view; an id no topic has is UNKNOWN_TOPIC_ID.
    let mut unknown_ids = Vec::new();
    {
        let view = shard.view.borrow();
        for topic in request.topics.iter_mut().flatten() {
            if topic.name.is_some() || topic.topic_id.is_nil() {
                continue;
            }
            match view
                .topics
                .iter()
                .find(|known| kafka_topic_id(known) == topic.topic_id)
            {
                Some(known) => topic.name = Some(TopicName(strata_kafka::text(&known.name))),
                None => unknown_ids.push(topic.topic_id),
            }
        }
    }
    let asked = Request::Metadata(translate::metadata_request(&request, header.api_version));
    let listing_all = matches!(&asked, Request::Metadata(m) if m.topics.is_none());
    let mut metadata = match native(shard, asked.clone()).await {
        Ok(Response::Metadata(metadata)) => metadata,
        answer => return unanswered("Metadata", answer),
    };
    // Kafka's auto.create.topics.enable, when the broker allows it and the client
    // asks for it (always, before Metadata v4).
    let wants_creation = header.api_version < 4 || request.allow_auto_topic_creation;
    if shard.context.config.kafka_auto_create_topics && wants_creation {
        let created = create_unknown_topics(shard, &metadata, |name| {
            authorize::topic(shard, client, Operation::Describe, name)
                && authorize::create_topic(shard, client, name)
        })
        .await;
        if created.any {
            metadata = match native(shard, asked).await {
                Ok(Response::Metadata(metadata)) => metadata,
                answer => return unanswered("Metadata", answer),
            };
        }
        // A name no topic may have is INVALID_TOPIC_EXCEPTION, which clients do not
        // retry, where a topic still to come is retried (Kafka answers both so).
        for topic in &mut metadata.topics {
            if created.invalid_names.contains(&topic.name) {
                topic.error = ErrorCode::InvalidTopicName;
            }
        }
    }
    // Only the topics the client may Describe: left out of a list of all, refused
    // where it named them.
    metadata.topics.retain_mut(|topic| {
        if authorize::topic(shard, client, Operation::Describe, &topic.name) {
            return true;
        }
        topic.error = ErrorCode::TopicAuthorizationFailed;
        topic.partitions.clear();
        !listing_all
    });
    let mut response = translate::metadata_response(metadata, &kafka_brokers(shard, client));
    // Topic ids (KIP-516): a KIP-848 consumer's assignment names its topics by id.
    let view = shard.view.borrow();
    for topic in &mut response.topics {
        let name = topic.name.as_ref().map(|name| name.as_str());
        if let Some(known) = view
            .topics
            .iter()
            .find(|known| Some(known.name.as_str()) == name)
        {
            topic.topic_id = kafka_topic_id(known);
        }
    }
    drop(view);
    response.topics.extend(unknown_ids.into_iter().map(|id| {
        strata_kafka::kafka_protocol::messages::metadata_response::MetadataResponseTopic::default()
            .with_error_code(errors::UNKNOWN_TOPIC_ID)
            .with_topic_id(id)
    }));
    encoded(&header, response)
}

/// A topic's id as Kafka's clients read it.
pub(super) fn kafka_topic_id(topic: &strata_coordinator::TopicState) -> uuid::Uuid {
    uuid::Uuid::from_bytes(topic.topic_id().0)
}

/// Produce, to the topics the client may Write. Written whatever the client's quota: its wait
/// was counted as the request was read and is reported in the answer.
async fn produce(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: frame::Produced,
) -> Outcome {
    let acks = request.request.acks;
    let produce = {
        let view = shard.view.borrow();
        translate::produce_request(request, |topic| {
            // The topic's own, else the broker's default set live.
            let compression_type = view
                .topics
                .iter()
                .find(|known| known.name == topic)?
                .config
                .get("compression.type")
                .or_else(|| view.dynamic.topic_defaults().get("compression.type"))?;
            crate::server::topic_config::kafka_compression_codec(compression_type).flatten()
        })
    };
    let mut produce = produce;
    authorize::refuse_topics(
        shard,
        client,
        Operation::Write,
        &mut produce.native.topics,
        &mut produce.refused,
    );
    let answered = if produce.native.topics.is_empty() {
        Ok(Response::Produce(strata_wire::protocol::ProduceResponse {
            topics: Vec::new(),
            record_errors: Default::default(),
            durability: Default::default(),
            log_append_times: Default::default(),
        }))
    } else {
        native(shard, Request::Produce(produce.native)).await
    };
    if acks == 0 {
        return Outcome::NoAnswer;
    }
    let native = match answered {
        Ok(Response::Produce(native)) => native,
        answer => return unanswered("Produce", answer),
    };
    encoded(
        &header,
        translate::produce_response(native, produce.refused),
    )
}

/// Fetch, from the topics the client may Read.
async fn fetch(
    shard: &Rc<Shard>,
    client: &Client,
    charge: &quota::Charge<'_>,
    mut header: Header,
    request: strata_kafka::kafka_protocol::messages::FetchRequest,
) -> Outcome {
    let mut fetch = match translate::fetch_request(&request) {
        Ok(fetch) => fetch,
        Err(error) => {
            let refused = FetchResponse::default().with_error_code(error);
            return answer(frame::encode_fetch_response(&header, &refused));
        }
    };
    // A consumer over its byte rate gets an empty answer, without a read, saying how long to
    // wait (Kafka reads, then answers empty; reading what is not sent is wasted).
    let now = shard.context.config.clock.now();
    let wait = charge.throttle(QuotaKey::ConsumerByteRate, now);
    if !wait.is_zero() {
        charge.hold(QuotaKey::ConsumerByteRate, wait, now);
        let throttled =
            FetchResponse::default().with_throttle_time_ms(header.throttle_ms.max(millis(wait)));
        return answer(frame::encode_fetch_response(&header, &throttled));
    }
    if let Some(most) = charge.max_answer_bytes(QuotaKey::ConsumerByteRate) {
        let most = u32::try_from(most.max(1)).unwrap_or(u32::MAX);
        fetch.native.max_bytes = fetch.native.max_bytes.min(most);
    }
    authorize::refuse_topics(
        shard,
        client,
        Operation::Read,
        &mut fetch.native.topics,
        &mut fetch.refused,
    );
    // Kafka batches go out as stored: from the page cache with `sendfile` where the
    // connection allows it, else as bytes; a range holding Strata batches is read and those
    // are translated.
    let native = if fetch.native.topics.is_empty() {
        strata_wire::protocol::FetchResponse {
            topics: Vec::new(),
            stability: Default::default(),
        }
    } else if client.takes_file_ranges() {
        let mut native = shard.fetch(fetch.native, Delivery::FileRanges).await;
        read_regions_to_translate(&mut native);
        native
    } else {
        shard.fetch(fetch.native, Delivery::Bytes).await
    };
    // Chunked: the records go out as the buffers they were stored or translated in.
    let (mut response, elsewhere) = translate::fetch_response(native, fetch.refused);
    if charge.governs(QuotaKey::ConsumerByteRate).is_some() {
        let bytes: usize = response
            .responses
            .iter()
            .flat_map(|topic| &topic.partitions)
            .filter_map(|partition| partition.records.as_ref().map(|records| records.len()))
            .chain(elsewhere.iter().map(|(_, _, source)| source.len as usize))
            .sum();
        let now = shard.context.config.clock.now();
        let wait = charge.record(QuotaKey::ConsumerByteRate, bytes as f64, now);
        charge.hold(QuotaKey::ConsumerByteRate, wait, now);
        header.throttle_ms = header.throttle_ms.max(millis(wait));
    }
    response.throttle_time_ms = header.throttle_ms;
    Outcome::Answer(frame::encode_fetch_parts(&header, &response, elsewhere))
}

/// Reads into memory the file ranges of a fetch's answer that hold a Strata batch (a native
/// producer's, a transaction marker): those are translated for a Kafka consumer. The ranges
/// are in the page cache (`read_for_sending` gives no other), so this is a copy, not a wait
/// on the disk. A range that cannot be read answers its partition with a storage error.
fn read_regions_to_translate(native: &mut strata_wire::protocol::FetchResponse) {
    use std::os::unix::fs::FileExt;
    for partition in native
        .topics
        .iter_mut()
        .flat_map(|topic| &mut topic.partitions)
    {
        let strata_wire::protocol::Records::Elsewhere(source) = &partition.records else {
            continue;
        };
        let region = source
            .source
            .downcast_ref::<crate::log::FileRegion>()
            .expect("a shard's fetch answers with file regions only");
        if region.kafka_only {
            continue;
        }
        let read = region
            .file
            .try_clone()
            .map(std::fs::File::from)
            .and_then(|file| {
                let mut bytes = vec![0; region.len];
                file.read_exact_at(&mut bytes, region.position)?;
                Ok(bytes)
            });
        partition.records = match read {
            Ok(bytes) => strata_wire::protocol::Records::Shared(bytes.into()),
            Err(error) => {
                tracing::warn!("reading a fetched range to translate it failed: {error}");
                partition.error = strata_wire::protocol::ErrorCode::StorageError;
                strata_wire::protocol::Records::empty()
            }
        };
    }
}

/// ListOffsets, of the topics the client may Describe.
async fn list_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: strata_kafka::kafka_protocol::messages::ListOffsetsRequest,
) -> Outcome {
    let mut list = translate::list_offsets_request(&request);
    authorize::refuse_topics(
        shard,
        client,
        Operation::Describe,
        &mut list.native.topics,
        &mut list.refused,
    );
    refuse_other_leader_epochs(shard, &request, &mut list);
    let native = if list.native.topics.is_empty() {
        strata_wire::protocol::ListOffsetsResponse { topics: Vec::new() }
    } else {
        match native(shard, Request::ListOffsets(list.native)).await {
            Ok(Response::ListOffsets(native)) => native,
            answer => return unanswered("ListOffsets", answer),
        }
    };
    // Each answered offset's leader epoch (v4+), from the leader's epoch cache: the epoch of
    // the record there, or of the last one before it (the end of the log).
    let mut epochs = std::collections::HashMap::new();
    if header.api_version >= 4 {
        for topic in &native.topics {
            for partition in topic.partitions.iter().filter(|p| p.offset >= 0) {
                let key = (topic.name.clone(), partition.partition);
                if let Ok((summary, _)) = shard.leader_summary(&key.0, key.1).await {
                    epochs.insert(key, summary.epochs);
                }
            }
        }
    }
    let leader_epoch = |topic: &str, partition: u32, offset: i64| {
        epochs
            .get(&(topic.to_string(), partition))
            .and_then(|epochs| epochs.epoch_of(offset as u64))
            .map_or(-1, |epoch| epoch as i32)
    };
    encoded(
        &header,
        translate::list_offsets_response(native, list.refused, leader_epoch),
    )
}

/// A ListOffsets partition whose caller names a leader epoch (v4+) other than the one this
/// broker's view has is refused, as a fetch is: FENCED_LEADER_EPOCH when the caller's is
/// older (its leader moved on), UNKNOWN_LEADER_EPOCH when newer (this broker has not heard yet).
fn refuse_other_leader_epochs(
    shard: &Shard,
    request: &strata_kafka::kafka_protocol::messages::ListOffsetsRequest,
    list: &mut translate::ListOffsets,
) {
    let view = shard.view.borrow();
    for asked in &request.topics {
        let Some(known) = view.topics.iter().find(|t| t.name == asked.name.0.as_str()) else {
            continue;
        };
        for partition in &asked.partitions {
            let current = partition.current_leader_epoch;
            let Some(state) = usize::try_from(partition.partition_index)
                .ok()
                .and_then(|index| known.partitions.get(index))
            else {
                continue;
            };
            let error = match i64::from(current).cmp(&i64::from(state.leader_epoch)) {
                _ if current < 0 => continue,
                std::cmp::Ordering::Less => errors::FENCED_LEADER_EPOCH,
                std::cmp::Ordering::Greater => errors::UNKNOWN_LEADER_EPOCH,
                std::cmp::Ordering::Equal => continue,
            };
            // Only a partition still asked (not refused already, for its ACL say).
            let Some(topic) = list.native.topics.iter_mut().find(|t| t.name == known.name) else {
                continue;
            };
            let before = topic.partitions.len();
            topic.partitions.retain(|p| p.partition != state.partition);
            if topic.partitions.len() == before {
                continue;
            }
            list.refused.push(translate::Refused {
                topic: known.name.clone(),
                partition: partition.partition_index,
                error,
            });
        }
    }
    list.native
        .topics
        .retain(|topic| !topic.partitions.is_empty());
}

/// What creating a metadata answer's unknown topics did.
struct Created {
    /// Some topic was created (or appeared meanwhile).
    any: bool,
    /// Names refused as names: no topic can have them.
    invalid_names: Vec<String>,
}

/// Creates the topics a metadata answer found unknown, with the broker's topic defaults.
async fn create_unknown_topics(
    shard: &Rc<Shard>,
    metadata: &strata_wire::protocol::MetadataResponse,
    allowed: impl Fn(&str) -> bool,
) -> Created {
    let mut created = Created {
        any: false,
        invalid_names: Vec::new(),
    };
    for topic in &metadata.topics {
        if topic.error != ErrorCode::UnknownTopic || !allowed(&topic.name) {
            continue;
        }
        let defaults = shard.kafka_topic_defaults();
        let create = strata_wire::protocol::CreateTopicRequest {
            name: topic.name.clone(),
            partitions: defaults.partitions,
            replication_factor: defaults.replication_factor,
            configs: Vec::new(),
            replica_assignment: Default::default(),
        };
        match native(shard, Request::CreateTopic(create)).await {
            Ok(Response::CreateTopic(answer))
                if matches!(
                    answer.error,
                    ErrorCode::None | ErrorCode::TopicAlreadyExists
                ) =>
            {
                tracing::info!(topic = %topic.name, "created on a Kafka client's first use");
                created.any = true;
            }
            Ok(Response::CreateTopic(answer)) if answer.error == ErrorCode::InvalidTopicName => {
                tracing::debug!(topic = %topic.name, "not created on first use: {}", answer.message);
                created.invalid_names.push(topic.name.clone());
            }
            answer => {
                tracing::info!(topic = %topic.name, ?answer, "not created on first use");
            }
        }
    }
    created
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
