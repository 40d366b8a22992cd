//! The data APIs: Metadata, Produce, Fetch and ListOffsets, each checked against the client's
//! ACLs, translated to the native request, run through the shard's own handler, and answered in
//! Kafka's terms.

use std::rc::Rc;

use strata_auth::acl::Operation;
use strata_coordinator::quotas::QuotaKey;
use strata_kafka::errors;
use strata_kafka::frame::{self, Header, KafkaRequest};
use strata_kafka::kafka_protocol::messages::{FetchResponse, TopicName};
use strata_kafka::translate::{self};
use strata_wire::protocol::{ErrorCode, Request, Response};

use super::{
    answer, authorize, encoded, kafka_brokers, kafka_topic_id, millis, native, quota, unanswered,
};
use crate::server::listener::{Client, Outcome};
use crate::server::messages::Delivery;
use crate::server::shard::Shard;

/// Answers a data API request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    charge: &quota::Charge<'_>,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::Metadata(request) => metadata(shard, client, header, request).await,
        KafkaRequest::Produce(request) => produce(shard, client, header, request).await,
        KafkaRequest::Fetch(request) => fetch(shard, client, charge, header, request).await,
        KafkaRequest::ListOffsets(request) => list_offsets(shard, client, header, request).await,
        _ => unreachable!("only the data APIs come here"),
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
    let mut response = translate::produce_response(native, produce.refused);
    if header.api_version >= 10 {
        let leader_of = |topic: &str, partition: i32| leader_and_epoch(shard, topic, partition);
        translate::produce_leader_hints(&mut response, leader_of, &kafka_brokers(shard, client));
    }
    encoded(&header, response)
}

/// A partition's leader and its epoch, as this broker's view has them (KIP-951's hint to a
/// client that asked another broker).
fn leader_and_epoch(shard: &Shard, topic: &str, partition: i32) -> Option<(i32, i32)> {
    let view = shard.view.borrow();
    let known = view.topics.iter().find(|known| known.name == topic)?;
    let state = known.partitions.get(usize::try_from(partition).ok()?)?;
    (state.leader >= 0).then_some((state.leader, state.leader_epoch as i32))
}

/// Fetch, from the topics the client may Read.
async fn fetch(
    shard: &Rc<Shard>,
    client: &Client,
    charge: &quota::Charge<'_>,
    mut header: Header,
    request: strata_kafka::kafka_protocol::messages::FetchRequest,
) -> Outcome {
    let topic_named = |id| {
        let view = shard.view.borrow();
        let topic = view
            .topics
            .iter()
            .find(|known| kafka_topic_id(known) == id)?;
        Some(topic.name.clone())
    };
    let mut fetch = match translate::fetch_request(&request, topic_named) {
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
    let topic_id_of = |name: &str| {
        let view = shard.view.borrow();
        let topic = view.topics.iter().find(|known| known.name == name);
        topic.map_or(uuid::Uuid::nil(), kafka_topic_id)
    };
    let (mut response, elsewhere) =
        translate::fetch_response(native, fetch.refused, fetch.unknown_ids, topic_id_of);
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
    if header.api_version >= 16 {
        let leader_of = |topic: &str, partition: i32| leader_and_epoch(shard, topic, partition);
        translate::fetch_leader_hints(&mut response, leader_of, &kafka_brokers(shard, client));
    }
    Outcome::Answer(frame::encode_fetch_parts(&header, &response, elsewhere))
}

/// Reads into memory the file ranges of a fetch's answer that hold a Strata batch (a native
/// producer's, a transaction marker): those are translated for a Kafka consumer. The ranges
/// are in the page cache (`read_for_sending` gives no other), so this is a copy, not a wait
/// on the disk. A range that cannot be read answers its partition with a storage error.
fn read_regions_to_translate(native: &mut strata_wire::protocol::FetchResponse) {
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
        partition.records = match crate::server::shard::read_cached_region(region) {
            Ok(bytes) => strata_wire::protocol::Records::Shared(bytes),
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
