//! What each Kafka request needs of the caller's roles, and the answer when
//! the caller lacks it: the same levels as the HTTP routes that do the same
//! thing (`http::auth::level`), and Kafka's authorization error on every
//! item of the request, so a client reports which topic or group it may
//! not touch.
//!
//! Producing is writing (`POST /api/v1/push`); reading by offset, listing
//! and describing are reading; taking part in a group and committing is
//! consuming (a pop, read-write); creating topics is configuring
//! (read-write); deleting topics, groups or offsets is an admin's (the
//! HTTP DELETE routes).

use kafka_protocol::messages::*;

use super::conn::{Reply, Request};
use crate::http::auth::Level;
use super::codes::{
    CLUSTER_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED as GROUP, TOPIC_AUTHORIZATION_FAILED as TOPIC,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
};

/// The level a request needs.
pub fn need(key: ApiKey) -> Level {
    match key {
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate | ApiKey::FindCoordinator => Level::Public,
        ApiKey::Produce | ApiKey::InitProducerId | ApiKey::AddPartitionsToTxn | ApiKey::EndTxn => Level::WriteOnly,
        ApiKey::Fetch
        | ApiKey::ListOffsets
        | ApiKey::Metadata
        | ApiKey::OffsetFetch
        | ApiKey::DescribeGroups
        | ApiKey::ListGroups
        | ApiKey::DescribeConfigs
        | ApiKey::DescribeCluster => {
            Level::ReadOnly
        }
        ApiKey::DeleteTopics | ApiKey::DeleteGroups | ApiKey::OffsetDelete => Level::Admin,
        _ => Level::ReadWrite,
    }
}

macro_rules! decode {
    ($req:expr, $t:ty) => {
        match $req.decode::<$t>() {
            Ok(r) => r,
            Err(reply) => return reply,
        }
    };
}

/// The refusal of a request whose caller lacks [`need`]'s level.
pub fn denied(req: &Request) -> Reply {
    match req.key {
        ApiKey::Produce => {
            let r = decode!(req, ProduceRequest);
            if r.acks == 0 {
                return Reply::Nothing;
            }
            let mut a = ProduceResponse::default();
            for t in &r.topic_data {
                let mut out = produce_response::TopicProduceResponse::default();
                out.name = t.name.clone();
                for p in &t.partition_data {
                    let mut e = produce_response::PartitionProduceResponse::default();
                    e.index = p.index;
                    e.error_code = TOPIC;
                    e.base_offset = -1;
                    out.partition_responses.push(e);
                }
                a.responses.push(out);
            }
            req.answer(&a)
        }
        ApiKey::Fetch => {
            let r = decode!(req, FetchRequest);
            let mut a = FetchResponse::default();
            for t in &r.topics {
                let mut out = fetch_response::FetchableTopicResponse::default();
                out.topic = t.topic.clone();
                out.topic_id = t.topic_id;
                for p in &t.partitions {
                    let mut e = fetch_response::PartitionData::default();
                    e.partition_index = p.partition;
                    e.error_code = TOPIC;
                    e.high_watermark = -1;
                    out.partitions.push(e);
                }
                a.responses.push(out);
            }
            req.answer(&a)
        }
        ApiKey::ListOffsets => {
            let r = decode!(req, ListOffsetsRequest);
            let mut a = ListOffsetsResponse::default();
            for t in &r.topics {
                let mut out = list_offsets_response::ListOffsetsTopicResponse::default();
                out.name = t.name.clone();
                for p in &t.partitions {
                    let mut e = list_offsets_response::ListOffsetsPartitionResponse::default();
                    e.partition_index = p.partition_index;
                    e.error_code = TOPIC;
                    out.partitions.push(e);
                }
                a.topics.push(out);
            }
            req.answer(&a)
        }
        ApiKey::Metadata => {
            let r = decode!(req, MetadataRequest);
            let mut a = MetadataResponse::default();
            for t in r.topics.iter().flatten() {
                let mut out = metadata_response::MetadataResponseTopic::default();
                out.name = t.name.clone();
                out.error_code = TOPIC;
                a.topics.push(out);
            }
            req.answer(&a)
        }
        ApiKey::OffsetFetch => {
            let r = decode!(req, OffsetFetchRequest);
            let mut a = OffsetFetchResponse::default();
            if req.version >= 2 {
                a.error_code = GROUP;
            }
            for t in r.topics.iter().flatten() {
                let mut out = offset_fetch_response::OffsetFetchResponseTopic::default();
                out.name = t.name.clone();
                for &index in &t.partition_indexes {
                    let mut e = offset_fetch_response::OffsetFetchResponsePartition::default();
                    e.partition_index = index;
                    e.committed_offset = -1;
                    e.error_code = GROUP;
                    out.partitions.push(e);
                }
                a.topics.push(out);
            }
            req.answer(&a)
        }
        ApiKey::OffsetCommit => {
            let r = decode!(req, OffsetCommitRequest);
            let mut a = OffsetCommitResponse::default();
            for t in &r.topics {
                let mut out = offset_commit_response::OffsetCommitResponseTopic::default();
                out.name = t.name.clone();
                for p in &t.partitions {
                    let mut e = offset_commit_response::OffsetCommitResponsePartition::default();
                    e.partition_index = p.partition_index;
                    e.error_code = GROUP;
                    out.partitions.push(e);
                }
                a.topics.push(out);
            }
            req.answer(&a)
        }
        ApiKey::JoinGroup => {
            let mut a = JoinGroupResponse::default();
            a.error_code = GROUP;
            a.generation_id = -1;
            if req.version < 7 {
                a.protocol_name = Some(Default::default());
            }
            req.answer(&a)
        }
        ApiKey::SyncGroup => {
            let mut a = SyncGroupResponse::default();
            a.error_code = GROUP;
            req.answer(&a)
        }
        ApiKey::Heartbeat => {
            let mut a = HeartbeatResponse::default();
            a.error_code = GROUP;
            req.answer(&a)
        }
        ApiKey::LeaveGroup => {
            let r = decode!(req, LeaveGroupRequest);
            let mut a = LeaveGroupResponse::default();
            a.error_code = GROUP;
            if req.version >= 3 {
                a.members = r
                    .members
                    .iter()
                    .map(|m| {
                        let mut e = leave_group_response::MemberResponse::default();
                        e.member_id = m.member_id.clone();
                        e.group_instance_id = m.group_instance_id.clone();
                        e.error_code = GROUP;
                        e
                    })
                    .collect();
            }
            req.answer(&a)
        }
        ApiKey::ListGroups => {
            let mut a = ListGroupsResponse::default();
            a.error_code = GROUP;
            req.answer(&a)
        }
        ApiKey::DescribeGroups => {
            let r = decode!(req, DescribeGroupsRequest);
            let mut a = DescribeGroupsResponse::default();
            for g in &r.groups {
                let mut out = describe_groups_response::DescribedGroup::default();
                out.group_id = g.clone();
                out.error_code = GROUP;
                a.groups.push(out);
            }
            req.answer(&a)
        }
        ApiKey::DeleteGroups => {
            let r = decode!(req, DeleteGroupsRequest);
            let mut a = DeleteGroupsResponse::default();
            for g in &r.groups_names {
                let mut out = delete_groups_response::DeletableGroupResult::default();
                out.group_id = g.clone();
                out.error_code = GROUP;
                a.results.push(out);
            }
            req.answer(&a)
        }
        ApiKey::OffsetDelete => {
            let mut a = OffsetDeleteResponse::default();
            a.error_code = GROUP;
            req.answer(&a)
        }
        ApiKey::CreateTopics => {
            let r = decode!(req, CreateTopicsRequest);
            let mut a = CreateTopicsResponse::default();
            for t in &r.topics {
                let mut out = create_topics_response::CreatableTopicResult::default();
                out.name = t.name.clone();
                out.error_code = TOPIC;
                a.topics.push(out);
            }
            req.answer(&a)
        }
        ApiKey::CreatePartitions => {
            let r = decode!(req, CreatePartitionsRequest);
            let mut a = CreatePartitionsResponse::default();
            for t in &r.topics {
                let mut out = create_partitions_response::CreatePartitionsTopicResult::default();
                out.name = t.name.clone();
                out.error_code = TOPIC;
                a.results.push(out);
            }
            req.answer(&a)
        }
        ApiKey::DeleteTopics => {
            let r = decode!(req, DeleteTopicsRequest);
            let names: Vec<Option<TopicName>> =
                if req.version >= 6 { r.topics.iter().map(|t| t.name.clone()).collect() } else { r.topic_names.into_iter().map(Some).collect() };
            let mut a = DeleteTopicsResponse::default();
            for name in names {
                let mut out = delete_topics_response::DeletableTopicResult::default();
                out.name = name;
                out.error_code = TOPIC;
                a.responses.push(out);
            }
            req.answer(&a)
        }
        ApiKey::DescribeCluster => {
            let mut a = DescribeClusterResponse::default();
            a.error_code = CLUSTER_AUTHORIZATION_FAILED;
            req.answer(&a)
        }
        ApiKey::DescribeConfigs => {
            let r = decode!(req, DescribeConfigsRequest);
            let mut a = DescribeConfigsResponse::default();
            for res in &r.resources {
                let mut out = describe_configs_response::DescribeConfigsResult::default();
                out.resource_type = res.resource_type;
                out.resource_name = res.resource_name.clone();
                out.error_code = TOPIC;
                a.results.push(out);
            }
            req.answer(&a)
        }
        ApiKey::IncrementalAlterConfigs => {
            let r = decode!(req, IncrementalAlterConfigsRequest);
            let mut a = IncrementalAlterConfigsResponse::default();
            for res in &r.resources {
                let mut out = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
                out.resource_type = res.resource_type;
                out.resource_name = res.resource_name.clone();
                out.error_code = TOPIC;
                a.responses.push(out);
            }
            req.answer(&a)
        }
        ApiKey::InitProducerId => {
            let mut a = InitProducerIdResponse::default();
            a.error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED; // Kafka's answer to a producer without write
            a.producer_id = ProducerId(-1);
            a.producer_epoch = -1;
            req.answer(&a)
        }
        ApiKey::AddPartitionsToTxn => {
            let r = decode!(req, AddPartitionsToTxnRequest);
            let mut a = AddPartitionsToTxnResponse::default();
            a.results_by_topic_v3_and_below = r
                .v3_and_below_topics
                .iter()
                .map(|t| {
                    let mut out = add_partitions_to_txn_response::AddPartitionsToTxnTopicResult::default();
                    out.name = t.name.clone();
                    out.results_by_partition = t
                        .partitions
                        .iter()
                        .map(|&p| {
                            let mut a = add_partitions_to_txn_response::AddPartitionsToTxnPartitionResult::default();
                            a.partition_index = p;
                            a.partition_error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
                            a
                        })
                        .collect();
                    out
                })
                .collect();
            req.answer(&a)
        }
        ApiKey::EndTxn => {
            let r = decode!(req, EndTxnRequest);
            let mut a = EndTxnResponse::default();
            (a.error_code, a.producer_id, a.producer_epoch) = (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, r.producer_id, r.producer_epoch);
            req.answer(&a)
        }
        ApiKey::AddOffsetsToTxn => {
            let mut a = AddOffsetsToTxnResponse::default();
            a.error_code = GROUP;
            req.answer(&a)
        }
        ApiKey::TxnOffsetCommit => {
            let r = decode!(req, TxnOffsetCommitRequest);
            let mut a = TxnOffsetCommitResponse::default();
            for t in &r.topics {
                let mut out = txn_offset_commit_response::TxnOffsetCommitResponseTopic::default();
                out.name = t.name.clone();
                for p in &t.partitions {
                    let mut part = txn_offset_commit_response::TxnOffsetCommitResponsePartition::default();
                    (part.partition_index, part.error_code) = (p.partition_index, GROUP);
                    out.partitions.push(part);
                }
                a.topics.push(out);
            }
            req.answer(&a)
        }
        other => Reply::Close(format!("{other:?} refused: insufficient permissions")),
    }
}
