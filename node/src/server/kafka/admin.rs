//! Kafka's administration APIs on the Kafka listener: each topic or group of a request runs
//! as its native request (`strata_kafka::admin` translates both ways).

use std::rc::Rc;

use strata_kafka::admin;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    ListGroupsResponse,
};
use strata_wire::protocol::{self as native, Request, Response};

use super::super::shard::Shard;
use super::native;

pub(super) async fn create_topics(
    shard: &Rc<Shard>,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut results = Vec::new();
    for (name, translated) in admin::create_topics_requests(&request) {
        let result = match translated {
            Err(refusal) => admin::create_topic_result(&name, Err(refusal)),
            Ok(create) => {
                let response = match native(shard, Request::CreateTopic(create.clone())).await {
                    Ok(Response::CreateTopic(response)) => response,
                    Ok(_) | Err(_) => native::CreateTopicResponse {
                        error: native::ErrorCode::Internal,
                        message: "no answer from the broker".into(),
                    },
                };
                admin::create_topic_result(&name, Ok((response, &create)))
            }
        };
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

pub(super) async fn delete_topics(
    shard: &Rc<Shard>,
    version: i16,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut results = Vec::new();
    for name in admin::delete_topics_names(&request, version) {
        let error = match &name {
            None => errors::UNKNOWN_TOPIC_OR_PARTITION,
            Some(name) => {
                let delete = native::DeleteTopicRequest { name: name.clone() };
                match native(shard, Request::DeleteTopic(delete)).await {
                    Ok(Response::DeleteTopic(response)) => kafka_error(response.error),
                    Ok(_) => errors::UNKNOWN_SERVER_ERROR,
                    Err(code) => kafka_error(code),
                }
            }
        };
        results.push(admin::delete_topic_result(name, error));
    }
    DeleteTopicsResponse::default().with_responses(results)
}

pub(super) async fn create_partitions(
    shard: &Rc<Shard>,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    for (name, translated) in admin::create_partitions_requests(&request) {
        let created = match translated {
            Err(refusal) => Err(refusal),
            Ok(create) => match native(shard, Request::CreatePartitions(create)).await {
                Ok(Response::CreatePartitions(response)) => Ok(response),
                Ok(_) | Err(_) => Ok(native::CreatePartitionsResponse {
                    error: native::ErrorCode::Internal,
                    message: "no answer from the broker".into(),
                }),
            },
        };
        results.push(admin::create_partitions_result(&name, created));
    }
    CreatePartitionsResponse::default().with_results(results)
}

pub(super) async fn list_groups(shard: &Rc<Shard>) -> ListGroupsResponse {
    match native(shard, Request::ListGroups(native::ListGroupsRequest {})).await {
        Ok(Response::ListGroups(groups)) => admin::list_groups_response(groups),
        Ok(_) => ListGroupsResponse::default().with_error_code(errors::UNKNOWN_SERVER_ERROR),
        Err(code) => ListGroupsResponse::default().with_error_code(kafka_error(code)),
    }
}

pub(super) async fn describe_groups(
    shard: &Rc<Shard>,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut groups = Vec::new();
    for group in request.groups {
        let describe = native::DescribeGroupRequest {
            group: group.0.to_string(),
        };
        let described = match native(shard, Request::DescribeGroup(describe)).await {
            Ok(Response::DescribeGroup(described)) => described,
            Ok(_) | Err(_) => native::DescribeGroupResponse {
                error: native::ErrorCode::CoordinatorNotAvailable,
                group: group.0.to_string(),
                generation: -1,
                state: String::new(),
                assignor: String::new(),
                members: Vec::new(),
                offsets: Vec::new(),
            },
        };
        groups.push(admin::described_group(described));
    }
    DescribeGroupsResponse::default().with_groups(groups)
}
