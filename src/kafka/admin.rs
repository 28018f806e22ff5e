//! Kafka's admin requests with a Queen meaning (docs/KAFKA.md): topics are
//! created, widened and deleted as queues; groups are listed, described and
//! deleted as Queen consumer groups (their cursors), so a Kafka tool
//! (`kafka-consumer-groups`, a lag exporter) sees the groups HTTP consumers
//! made too.

use kafka_protocol::messages::create_partitions_request::CreatePartitionsRequest;
use kafka_protocol::messages::create_partitions_response::{CreatePartitionsResponse, CreatePartitionsTopicResult};
use kafka_protocol::messages::create_topics_request::CreateTopicsRequest;
use kafka_protocol::messages::create_topics_response::{CreatableTopicResult, CreateTopicsResponse};
use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::{DeletableGroupResult, DeleteGroupsResponse};
use kafka_protocol::messages::delete_topics_request::DeleteTopicsRequest;
use kafka_protocol::messages::delete_topics_response::{DeletableTopicResult, DeleteTopicsResponse};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::{DescribeGroupsResponse, DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::{ListGroupsResponse, ListedGroup};
use kafka_protocol::messages::offset_delete_request::OffsetDeleteRequest;
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::{GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::topics::{self, valid_name};
use super::Kafka;
use crate::db::DbError;
use crate::http::AppState;
use crate::tenancy::Tenant;
use super::codes::{self, *};

/// The widest topic a client may declare.
pub const MAX_PARTITIONS: i32 = 100_000;

fn text(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// `CreateTopics`: a queue per topic, with its declared width.
pub async fn create_topics(kafka: &Kafka, tenant: Tenant, req: &CreateTopicsRequest, version: i16) -> CreateTopicsResponse {
    let names: Vec<String> = req.topics.iter().map(|t| t.name.0.to_string()).collect();
    let existing = topics::widths(&kafka.state.pool, tenant, Some(&names), kafka.config.default_partitions).await;
    let mut r = CreateTopicsResponse::default();
    for t in &req.topics {
        let name = t.name.0.as_str();
        let width = if t.num_partitions == -1 { kafka.config.default_partitions } else { t.num_partitions };
        let mut out = CreatableTopicResult::default();
        out.name = t.name.clone();
        let (code, message) = match &existing {
            _ if !valid_name(name) => (INVALID_TOPIC_EXCEPTION, format!("'{name}' is not a valid topic name here (1-255 bytes, no leading '__')")),
            Err(_) => (KAFKA_STORAGE_ERROR, "the topics could not be read".into()),
            Ok(have) if have.iter().any(|(n, _)| n == name) => (TOPIC_ALREADY_EXISTS, format!("Topic '{name}' already exists.")),
            _ if !(1..=MAX_PARTITIONS).contains(&width) => (INVALID_PARTITIONS, format!("Number of partitions must be from 1 to {MAX_PARTITIONS}.")),
            _ if req.validate_only => (0, String::new()),
            _ => match declare(&kafka.state, tenant, name, width, true).await {
                Ok(()) => (0, String::new()),
                Err(e) => {
                    if let topics::CreateError::Db(e) = &e {
                        tracing::warn!(error = %e, "kafka create topics failed");
                    }
                    e.kafka()
                }
            },
        };
        out.error_code = code;
        if code != 0 && version >= 1 {
            out.error_message = Some(text(message));
        }
        if version >= 5 {
            out.num_partitions = if code == 0 { width } else { -1 };
            out.replication_factor = if code == 0 { 1 } else { -1 };
            out.configs = Some(Vec::new());
        }
        r.topics.push(out);
    }
    r
}

/// Creates the tenant's queue if needed (within its queue quota) and sets
/// its declared width: `fresh` for a new topic, else a raise (the width
/// only grows).
async fn declare(state: &AppState, tenant: Tenant, name: &str, width: i32, fresh: bool) -> Result<(), topics::CreateError> {
    let name = tenant.stored(name);
    if fresh {
        state.quotas.push(tenant, &[&name], 0, 0)?;
    }
    let client = state.pool.get().await.map_err(DbError::from)?;
    let sql = if fresh {
        "INSERT INTO queen.kafka_topics (queue_id, partitions) VALUES (queen.ensure_queue_v1($1), $2)
         ON CONFLICT (queue_id) DO NOTHING"
    } else {
        "INSERT INTO queen.kafka_topics AS k (queue_id, partitions) VALUES (queen.ensure_queue_v1($1), $2)
         ON CONFLICT (queue_id) DO UPDATE SET partitions = GREATEST(k.partitions, EXCLUDED.partitions)"
    };
    client.execute(sql, &[&name, &width]).await.map_err(DbError::from)?;
    Ok(())
}

/// `CreatePartitions`: raises a topic's declared width.
pub async fn create_partitions(kafka: &Kafka, tenant: Tenant, req: &CreatePartitionsRequest) -> CreatePartitionsResponse {
    let names: Vec<String> = req.topics.iter().map(|t| t.name.0.to_string()).collect();
    let existing = topics::widths(&kafka.state.pool, tenant, Some(&names), kafka.config.default_partitions).await;
    let mut r = CreatePartitionsResponse::default();
    for t in &req.topics {
        let mut out = CreatePartitionsTopicResult::default();
        out.name = t.name.clone();
        let now = existing.as_ref().ok().and_then(|have| have.iter().find(|(n, _)| n == t.name.0.as_str()).map(|(_, w)| *w));
        let (code, message) = match (&existing, now) {
            (Err(_), _) => (KAFKA_STORAGE_ERROR, "the topics could not be read".to_string()),
            (_, None) => (UNKNOWN_TOPIC_OR_PARTITION, format!("The topic '{}' does not exist.", t.name.0)),
            (_, Some(w)) if t.count <= w => (INVALID_PARTITIONS, format!("Topic currently has {w} partitions, which is higher than or equal to the requested {}.", t.count)),
            _ if t.count > MAX_PARTITIONS => (INVALID_PARTITIONS, format!("Number of partitions must be at most {MAX_PARTITIONS}.")),
            _ if req.validate_only => (0, String::new()),
            _ => match declare(&kafka.state, tenant, &t.name.0, t.count, false).await {
                Ok(()) => (0, String::new()),
                Err(_) => (KAFKA_STORAGE_ERROR, "the width could not be written".into()),
            },
        };
        out.error_code = code;
        out.error_message = (code != 0).then(|| text(message));
        r.results.push(out);
    }
    r
}

/// `DeleteTopics`: deletes the queues, with everything under them.
pub async fn delete_topics(kafka: &Kafka, tenant: Tenant, req: &DeleteTopicsRequest, version: i16) -> DeleteTopicsResponse {
    // v6 names topics in `topics` (by name or id); earlier versions in `topic_names`.
    let names: Vec<Option<TopicName>> =
        if version >= 6 { req.topics.iter().map(|t| t.name.clone()).collect() } else { req.topic_names.iter().cloned().map(Some).collect() };
    let mut r = DeleteTopicsResponse::default();
    for name in names {
        let mut out = DeletableTopicResult::default();
        out.error_code = match &name {
            None => UNKNOWN_TOPIC_ID,
            Some(n) if !valid_name(&n.0) => UNKNOWN_TOPIC_OR_PARTITION,
            Some(n) => match kafka.state.delete_queue(&tenant.stored(&n.0)).await {
                Ok(answer) if answer["existed"] == true => 0,
                Ok(_) => UNKNOWN_TOPIC_OR_PARTITION,
                Err(e) => {
                    tracing::warn!(error = %e, "kafka delete topics failed");
                    KAFKA_STORAGE_ERROR
                }
            },
        };
        out.name = name;
        r.responses.push(out);
    }
    r
}

/// Kafka's name of a group state.
fn state_name(s: super::groups::State) -> &'static str {
    use super::groups::State::*;
    match s {
        Empty => "Empty",
        Preparing => "PreparingRebalance",
        Completing => "CompletingRebalance",
        Stable => "Stable",
    }
}

/// The Queen consumer groups that hold cursors on `tenant`'s queues, but
/// Queen's internal ones.
async fn stored_groups(pool: &deadpool_postgres::Pool, tenant: Tenant, only: Option<&[String]>) -> Result<Vec<String>, DbError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT DISTINCT c.consumer_group FROM queen.consumers c
             JOIN queen.partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = p.queue_id
             WHERE c.consumer_group NOT LIKE '\\_\\_%' AND ($1::text[] IS NULL OR c.consumer_group = ANY($1)) AND q.tenant_id = $2
             ORDER BY 1",
            &[&only, &tenant.0],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// `ListGroups`: the groups this broker coordinates, and every Queen group
/// with cursors (as `Empty` consumer groups).
pub async fn list_groups(kafka: &Kafka, tenant: Tenant, req: &ListGroupsRequest) -> ListGroupsResponse {
    let mut r = ListGroupsResponse::default();
    // The coordinator keeps every tenant's groups, by stored name.
    let mut all: Vec<(String, &'static str, String)> = kafka
        .groups
        .groups()
        .into_iter()
        .filter(|(name, ..)| tenant.owns(name))
        .map(|(name, state, protocol_type)| (crate::tenancy::shown(&name).to_string(), state_name(state), protocol_type))
        .collect();
    match stored_groups(&kafka.state.pool, tenant, None).await {
        Ok(stored) => {
            // Each broker lists the groups it coordinates; a client asks them all.
            for g in stored.into_iter().filter(|g| kafka.nodes.mine(&super::coordination_key(&tenant.stored(g)))) {
                if !all.iter().any(|(n, ..)| *n == g) {
                    all.push((g, "Empty", "consumer".into()));
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "kafka list groups failed");
            r.error_code = KAFKA_STORAGE_ERROR;
        }
    }
    all.sort();
    let wanted: Vec<String> = req.states_filter.iter().map(|s| s.to_ascii_lowercase()).collect();
    r.groups = all
        .into_iter()
        .filter(|(_, state, _)| wanted.is_empty() || wanted.contains(&state.to_ascii_lowercase()))
        .map(|(name, state, protocol_type)| {
            let mut g = ListedGroup::default();
            g.group_id = GroupId(text(name));
            g.protocol_type = text(protocol_type);
            g.group_state = StrBytes::from_static_str(state);
            g
        })
        .collect();
    r
}

/// `DescribeGroups`: members and their assignments for a group this broker
/// coordinates; `Empty` for a Queen group with cursors; `Dead` otherwise.
pub async fn describe_groups(kafka: &Kafka, tenant: Tenant, req: &DescribeGroupsRequest, version: i16) -> DescribeGroupsResponse {
    let names: Vec<String> = req.groups.iter().map(|g| g.0.to_string()).collect();
    let stored = stored_groups(&kafka.state.pool, tenant, Some(&names)).await;
    let mut r = DescribeGroupsResponse::default();
    for name in names {
        let mut out = DescribedGroup::default();
        out.group_id = GroupId(text(name.clone()));
        let member_of = tenant.stored(&name);
        if !kafka.nodes.mine(&super::coordination_key(&member_of)) {
            out.error_code = codes::NOT_COORDINATOR;
            r.groups.push(out);
            continue;
        }
        match kafka.groups.describe(&member_of) {
            Some(view) => {
                out.group_state = StrBytes::from_static_str(state_name(view.state));
                out.protocol_type = text(view.protocol_type);
                out.protocol_data = text(view.protocol);
                out.members = view
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut d = DescribedGroupMember::default();
                        d.member_id = text(m.id);
                        if version >= 4 {
                            d.group_instance_id = m.instance_id.map(text);
                        }
                        d.client_id = text(m.client_id);
                        d.client_host = text(m.client_host);
                        d.member_metadata = m.metadata;
                        d.member_assignment = m.assignment;
                        d
                    })
                    .collect();
            }
            None => match &stored {
                Ok(s) if s.contains(&name) => {
                    out.group_state = StrBytes::from_static_str("Empty");
                    out.protocol_type = StrBytes::from_static_str("consumer");
                }
                Ok(_) => out.group_state = StrBytes::from_static_str("Dead"),
                Err(_) => out.error_code = KAFKA_STORAGE_ERROR,
            },
        }
        r.groups.push(out);
    }
    r
}

/// `DeleteGroups`: a group without members loses its cursors and
/// subscriptions (the HTTP route's delete).
pub async fn delete_groups(kafka: &Kafka, tenant: Tenant, req: &DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut r = DeleteGroupsResponse::default();
    for g in &req.groups_names {
        let mut out = DeletableGroupResult::default();
        out.group_id = g.clone();
        let member_of = tenant.stored(&g.0);
        out.error_code = if !kafka.nodes.mine(&super::coordination_key(&member_of)) {
            codes::NOT_COORDINATOR
        } else if kafka.groups.has_members(&member_of) {
            NON_EMPTY_GROUP
        } else {
            match kafka.state.delete_group(tenant, &g.0, None, true).await {
                Ok((0, _)) => GROUP_ID_NOT_FOUND,
                Ok(_) => 0,
                Err(_) => KAFKA_STORAGE_ERROR,
            }
        };
        r.results.push(out);
    }
    r
}

/// `OffsetDelete`: removes a group's cursors on some partitions; refused
/// while the group has members (Kafka refuses it for a topic they
/// subscribe to).
pub async fn offset_delete(kafka: &Kafka, tenant: Tenant, req: &OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = req.group_id.0.as_str();
    let member_of = tenant.stored(group);
    let mut r = OffsetDeleteResponse::default();
    if !kafka.nodes.mine(&super::coordination_key(&member_of)) {
        r.error_code = codes::NOT_COORDINATOR;
        return r;
    }
    let active = kafka.groups.has_members(&member_of);
    let client = kafka.state.pool.get().await;
    for t in &req.topics {
        let mut out = OffsetDeleteResponseTopic::default();
        out.name = t.name.clone();
        for p in &t.partitions {
            let mut a = OffsetDeleteResponsePartition::default();
            a.partition_index = p.partition_index;
            a.error_code = match (&client, topics::partition_name(p.partition_index)) {
                _ if active => GROUP_SUBSCRIBED_TO_TOPIC,
                (_, None) => UNKNOWN_TOPIC_OR_PARTITION,
                (Err(_), _) => KAFKA_STORAGE_ERROR,
                (Ok(c), Some(name)) => match c
                    .execute(
                        "DELETE FROM queen.consumers c USING queen.partitions p, queen.queues q
                         WHERE p.id = c.partition_id AND q.id = p.queue_id
                           AND c.consumer_group = $1 AND q.name = $2 AND p.name = $3",
                        &[&group, &tenant.stored(&t.name.0), &name],
                    )
                    .await
                {
                    Ok(_) => 0,
                    Err(_) => KAFKA_STORAGE_ERROR,
                },
            };
            out.partitions.push(a);
        }
        r.topics.push(out);
    }
    r
}
