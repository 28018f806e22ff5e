//! Topic configuration through Kafka's admin API, for the settings that have
//! a Queen meaning: `retention.ms` is the queue's `retentionSeconds` (-1, or
//! 0 seconds, keeps everything), and `cleanup.policy` is `delete` (a queue
//! is never compacted). Alters go through `/configure`'s own path
//! (`AppState::configure`), so every broker applies them at once, exactly
//! as an HTTP configure.

use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult};
use kafka_protocol::messages::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use kafka_protocol::messages::incremental_alter_configs_response::{AlterConfigsResourceResponse, IncrementalAlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use super::topics::valid_name;
use super::Kafka;
use crate::tenancy::Tenant;
use super::codes::*;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Kafka's config sources: set on the topic, or the default.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const DEFAULT_CONFIG: i8 = 5;
/// Kafka's config types: STRING and LONG.
const STRING: i8 = 2;
const LONG: i8 = 5;

/// The queue's retention in seconds, `None` when the queue does not exist.
async fn retention(kafka: &Kafka, tenant: Tenant, topic: &str) -> Result<Option<i32>, crate::db::DbError> {
    let client = kafka.state.pool.get().await?;
    let row = client.query_opt("SELECT retention_seconds FROM queen.queues WHERE name = $1", &[&tenant.stored(topic)]).await?;
    Ok(row.map(|r| r.get(0)))
}

/// `DescribeConfigs`: a topic's two settings; a broker has none to show.
pub async fn describe(kafka: &Kafka, tenant: Tenant, req: &DescribeConfigsRequest, version: i16) -> DescribeConfigsResponse {
    let mut r = DescribeConfigsResponse::default();
    for res in &req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let wanted = |name: &str| res.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name));
        let entry = |name: &'static str, value: String, source: i8, kind: i8| {
            let mut c = DescribeConfigsResourceResult::default();
            c.name = StrBytes::from_static_str(name);
            c.value = Some(StrBytes::from_string(value));
            c.config_source = source;
            if version >= 3 {
                c.config_type = kind;
            }
            c
        };
        match res.resource_type {
            BROKER => {}
            TOPIC if valid_name(&res.resource_name) => match retention(kafka, tenant, &res.resource_name).await {
                Ok(Some(seconds)) => {
                    if wanted("retention.ms") {
                        let (value, source) = if seconds > 0 { ((i64::from(seconds) * 1000).to_string(), DYNAMIC_TOPIC_CONFIG) } else { ("-1".into(), DEFAULT_CONFIG) };
                        out.configs.push(entry("retention.ms", value, source, LONG));
                    }
                    if wanted("cleanup.policy") {
                        out.configs.push(entry("cleanup.policy", "delete".into(), DEFAULT_CONFIG, STRING));
                    }
                }
                Ok(None) => out.error_code = UNKNOWN_TOPIC_OR_PARTITION,
                Err(_) => out.error_code = KAFKA_STORAGE_ERROR,
            },
            TOPIC => out.error_code = UNKNOWN_TOPIC_OR_PARTITION,
            _ => {
                out.error_code = INVALID_REQUEST;
                out.error_message = Some(StrBytes::from_static_str("only topic and broker configs are described"));
            }
        }
        r.results.push(out);
    }
    r
}

/// What an alter of a topic comes to: the retention to set, if any.
fn plan(configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig]) -> Result<Option<i32>, String> {
    let mut seconds = None;
    for c in configs {
        let (op, value) = (c.config_operation, c.value.as_ref().map(|v| v.as_str()));
        match (c.name.as_str(), op, value) {
            // SET, or DELETE back to the default (keep everything).
            ("retention.ms", 1, _) | ("retention.ms", 0, Some("-1")) => seconds = Some(0),
            ("retention.ms", 0, Some(v)) => {
                let ms: i64 = v.parse().map_err(|_| format!("retention.ms: {v} is not a number of milliseconds"))?;
                if ms < 1 {
                    return Err("retention.ms: -1 or at least 1".into());
                }
                // Whole seconds, rounded up: a queue keeps at least what was asked.
                seconds = Some(i32::try_from((ms + 999) / 1000).map_err(|_| "retention.ms: too large".to_string())?);
            }
            ("cleanup.policy", 0, Some("delete")) | ("cleanup.policy", 1, _) => {}
            ("cleanup.policy", 0, Some(v)) => return Err(format!("cleanup.policy={v}: a queue is never compacted; only delete is supported")),
            (name, 0 | 1, _) => return Err(format!("{name} has no Queen meaning; retention.ms and cleanup.policy do")),
            (name, _, _) => return Err(format!("{name}: only SET and DELETE apply")),
        }
    }
    Ok(seconds)
}

/// `IncrementalAlterConfigs`: `retention.ms` and `cleanup.policy=delete`
/// on topics; anything else is INVALID_CONFIG, with nothing changed.
pub async fn alter(kafka: &Kafka, tenant: Tenant, req: &IncrementalAlterConfigsRequest) -> IncrementalAlterConfigsResponse {
    let mut r = IncrementalAlterConfigsResponse::default();
    for res in &req.resources {
        let mut out = AlterConfigsResourceResponse::default();
        out.resource_type = res.resource_type;
        out.resource_name = res.resource_name.clone();
        let name = res.resource_name.as_str();
        let outcome: Result<(), (i16, String)> = async {
            if res.resource_type != TOPIC {
                return Err((INVALID_CONFIG, "only topic configs can be altered".into()));
            }
            let seconds = plan(&res.configs).map_err(|e| (INVALID_CONFIG, e))?;
            match retention(kafka, tenant, name).await {
                Ok(Some(_)) if valid_name(name) => {}
                Ok(_) => return Err((UNKNOWN_TOPIC_OR_PARTITION, format!("The topic '{name}' does not exist."))),
                Err(_) => return Err((KAFKA_STORAGE_ERROR, "the topic could not be read".into())),
            }
            let (Some(seconds), false) = (seconds, req.validate_only) else { return Ok(()) };
            let body = serde_json::json!({"queue": name, "options": {"retentionSeconds": seconds, "retentionEnabled": seconds > 0}});
            let encryption = kafka.state.coalescer.encryption().ring().is_some();
            let mut request = crate::admin::configure::parse(&body, encryption).map_err(|e| (INVALID_CONFIG, e.error))?;
            request.queue = tenant.stored(&request.queue);
            kafka.state.configure(&request).await.map(|_| ()).map_err(|_| (KAFKA_STORAGE_ERROR, "the configuration could not be written".into()))
        }
        .await;
        if let Err((code, message)) = outcome {
            out.error_code = code;
            out.error_message = Some(StrBytes::from_string(message));
        }
        r.responses.push(out);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;

    fn set(name: &str, op: i8, value: Option<&str>) -> AlterableConfig {
        let mut c = AlterableConfig::default();
        c.name = StrBytes::from_string(name.into());
        c.config_operation = op;
        c.value = value.map(|v| StrBytes::from_string(v.into()));
        c
    }

    #[test]
    fn retention_ms_becomes_whole_seconds_and_everything_else_is_refused() {
        assert_eq!(plan(&[set("retention.ms", 0, Some("86400000"))]), Ok(Some(86_400)));
        assert_eq!(plan(&[set("retention.ms", 0, Some("1500"))]), Ok(Some(2)));
        assert_eq!(plan(&[set("retention.ms", 0, Some("-1"))]), Ok(Some(0)));
        assert_eq!(plan(&[set("retention.ms", 1, None)]), Ok(Some(0)));
        assert_eq!(plan(&[set("cleanup.policy", 0, Some("delete"))]), Ok(None));
        assert!(plan(&[set("cleanup.policy", 0, Some("compact"))]).unwrap_err().contains("never compacted"));
        assert!(plan(&[set("retention.ms", 0, Some("soon"))]).is_err());
        assert!(plan(&[set("retention.ms", 0, Some("0"))]).is_err());
        assert!(plan(&[set("segment.bytes", 0, Some("1"))]).unwrap_err().contains("no Queen meaning"));
        assert!(plan(&[set("retention.ms", 2, Some("1"))]).is_err(), "APPEND has no meaning for a number");
    }
}
