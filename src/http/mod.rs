//! The HTTP surface: the axum router, one file per route family, and the
//! conversion of errors into JSON answers. Handlers are thin: parse, call the
//! path that does the work, render.

pub mod ack;
pub mod admin;
pub mod analytics;
pub mod auth;
pub mod body;
pub mod ephemeral;
pub mod error;
pub mod health;
pub mod identity;
pub mod kv;
pub mod limits;
pub mod locks;
pub mod messages;
pub mod metrics;
pub mod openapi;
pub mod pop;
pub mod push;
pub mod query;
pub mod reads;
pub mod server;
pub mod streams;
pub mod system;
pub mod tenants;
pub mod timers;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, Uri};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::Pool;

use crate::config::Config;
use crate::ack::AckService;
use crate::pop::PopService;
use crate::push::Coalescer;
use error::ApiError;

/// What every handler can reach: a handle on [`Shared`], cloned for every
/// request (axum hands each extractor and middleware layer its own copy).
/// One reference count to bump, where cloning the fields themselves bumped
/// some twenty, each a cache line both cores fight over under load.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The broker's services and settings, as the handlers see them.
pub struct Shared {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub coalescer: Coalescer,
    pub pop: Arc<PopService>,
    pub ack: Arc<AckService>,
    pub telemetry: Arc<crate::metrics::Telemetry>,
    /// Where pushes go during maintenance or an outage (None: no usable
    /// FILE_BUFFER_DIR, so those pushes fail instead).
    pub spool: Option<Arc<crate::push::spool::Spool>>,
    pub push_maintenance: Arc<std::sync::atomic::AtomicBool>,
    pub inflight: Arc<limits::InFlight>,
    pub traces: crate::reads::traces::TraceWriter,
    /// KV calls, single writes in shared commits.
    pub kv: crate::kv::KvWriter,
    /// The switches every broker honours (the KV, timers and ephemeral kill
    /// switches).
    pub switches: Arc<crate::admin::switches::Switches>,
    /// This broker's ephemeral (in-memory) queues.
    pub ephemeral: Arc<crate::ephemeral::Ephemeral>,
    /// The other brokers on the database: where committed pushes are told.
    pub cluster: Arc<crate::cluster::Cluster>,
    /// Which tenant each partition id belongs to, as far as looked up.
    pub owners: Arc<crate::tenancy::Owners>,
    /// The tenants' quotas and this broker's buckets.
    pub quotas: Arc<crate::tenancy::quota::Quotas>,
}

impl AppState {
    /// Whether KV (and the locks on it) serves: the environment allows it and
    /// no operator switched it off.
    pub fn kv_enabled(&self) -> bool {
        self.config.kv.enabled && !self.switches.is_off("kv")
    }

    /// Whether ephemeral queues serve: the environment allows them and no
    /// operator switched them off.
    pub fn ephemeral_enabled(&self) -> bool {
        self.config.ephemeral.enabled && !self.switches.is_off("ephemeral")
    }

    /// Whether scheduling timers is allowed (the fire never stops).
    pub fn timers_enabled(&self) -> bool {
        !self.switches.is_off("timers")
    }
}

impl AppState {
    pub fn push_maintenance(&self) -> bool {
        self.push_maintenance.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Replays the spool (unless push maintenance is on), waking consumers
    /// of what it commits.
    pub async fn replay_spool(&self) {
        let Some(spool) = &self.spool else { return };
        if self.push_maintenance() || !spool.has_pending() {
            return;
        }
        let on_commit = |results: &[crate::push::ItemResult]| {
            for r in results {
                if let crate::push::Outcome::Queued { partition_id, .. } = r.outcome {
                    self.committed_push(r.queue, partition_id, r.partition, 1);
                }
            }
        };
        match spool.replay(&self.coalescer, on_commit).await {
            Ok(n) if n > 0 => tracing::info!(messages = n, "spool replayed"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "spool replay stopped; retrying later"),
        }
    }

    /// `count` messages were committed to (queue, partition): counters, and
    /// the pop side's rings and wake gates.
    pub fn committed_push(&self, queue: &str, partition_id: i64, partition: &str, count: u64) {
        self.telemetry.pushed(queue, count);
        self.pop.pushed(queue, partition_id, partition, count);
        self.cluster.pushed(queue, partition_id, partition, count);
    }

    /// Tells the pop side (and the other brokers) which partitions a push
    /// answered just wrote to, and how many messages each: one call per
    /// partition, however many items it had.
    pub fn committed_results(&self, results: &[crate::push::ItemResult]) {
        let mut counts: Vec<(&crate::push::ItemResult, u64)> = Vec::new();
        let mut slots = crate::push::Slots::default();
        for r in results {
            if let crate::push::Outcome::Queued { partition_id, .. } = r.outcome {
                let i = slots.slot(partition_id, || {
                    counts.push((r, 0));
                    counts.len() - 1
                });
                counts[i].1 += 1;
            }
        }
        for (r, n) in counts {
            self.committed_push(r.queue, r.outcome.partition_id(), r.partition, n);
        }
    }

    /// Applies a queue's configuration (`POST /api/v1/configure`, Kafka's
    /// IncrementalAlterConfigs) and makes this broker and the others use it
    /// at once; answers the full effective configuration.
    pub async fn configure(&self, req: &crate::admin::configure::Request) -> Result<serde_json::Value, crate::db::DbError> {
        let answer = crate::admin::configure::apply(&self.pool, req).await?;
        // New settings apply to the next claim; a ring built under the old ones is dropped.
        self.pop.hotlist.forget(Some(&req.queue), None);
        let o = &answer["options"];
        let column = |k: &str| o[k].as_i64().unwrap_or(0).clamp(0, i32::MAX as i64) as i32;
        self.pop.settings.set(
            &req.queue,
            crate::pop::settings::QueueTimings::from_columns(column("minPopWaitTime"), column("delayedProcessing"), column("windowBuffer")),
        );
        self.coalescer.encryption().set(&req.queue, o["encryptionEnabled"].as_bool().unwrap_or(false));
        // The other brokers reread their cached settings of the queue now.
        self.cluster.announce_change();
        Ok(answer)
    }

    /// Deletes a queue and everything under it, and forgets its hot-list
    /// rings (`DELETE /api/v1/resources/queues/{q}`, Kafka's DeleteTopics).
    pub async fn delete_queue(&self, queue: &str) -> Result<serde_json::Value, crate::db::DbError> {
        let answer = crate::admin::resources::delete_queue(&self.pool, queue).await?;
        self.pop.hotlist.forget(Some(queue), None);
        Ok(answer)
    }

    /// Deletes a consumer group's cursors (on one queue or all) and forgets
    /// its hot-list rings; answers (cursors deleted, metadata deleted).
    pub async fn delete_group(
        &self,
        tenant: crate::tenancy::Tenant,
        group: &str,
        queue: Option<&str>,
        delete_metadata: bool,
    ) -> Result<(u64, bool), crate::db::DbError> {
        let answer = crate::admin::groups::delete(&self.pool, tenant, group, queue, delete_metadata).await?;
        self.pop.hotlist.forget(queue, Some(group));
        Ok(answer)
    }

    /// Counts the acks that took effect, per queue.
    pub fn count_acks(&self, outcomes: &[crate::ack::AckOutcome]) {
        let mut per_queue: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for o in outcomes.iter().filter(|o| o.success && !o.noop) {
            if let Some(q) = o.queue.as_deref() {
                *per_queue.entry(q).or_default() += 1;
            }
        }
        for (q, n) in per_queue {
            self.telemetry.acked(q, n);
        }
    }
}

/// The whole route table.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(crate::dashboard::index))
        .route("/dashboard/{file}", get(crate::dashboard::asset))
        .route("/health", get(health::health))
        .route("/api/v1/openapi.json", get(openapi::openapi))
        .route("/metrics", get(metrics::json))
        .route("/metrics/prometheus", get(metrics::prometheus))
        .route("/auth/me", get(identity::me))
        .route("/auth/login", get(identity::login))
        .route("/auth/logout", post(identity::logout))
        .route("/api/v1/push", post(push::push))
        .route("/api/v1/pop", get(pop::pop_discovery))
        .route("/api/v1/pop/queue/{queue}", get(pop::pop_queue))
        .route("/api/v1/pop/queue/{queue}/partition/{partition}", get(pop::pop_partition))
        .route("/api/v1/ack", post(ack::ack_one))
        .route("/api/v1/ack/batch", post(ack::ack_batch))
        .route("/api/v1/lease/{lease_id}/extend", post(ack::extend_lease))
        .route("/api/v1/transaction", post(ack::transaction))
        .route("/api/v1/configure", post(admin::configure))
        .route("/api/v1/resources/queues", get(admin::list_queues))
        .route("/api/v1/resources/queues/{queue}", get(admin::get_queue).delete(admin::delete_queue))
        .route("/api/v1/resources/queues/{queue}/depth", get(admin::queue_depth))
        .route("/api/v1/resources/overview", get(admin::overview))
        .route("/api/v1/resources/namespaces", get(admin::namespaces))
        .route("/api/v1/resources/quota", get(tenants::get_quota).post(tenants::set_quota))
        .route("/api/v1/resources/tenants", get(tenants::list))
        .route("/api/v1/resources/tenant", axum::routing::delete(tenants::purge))
        .route("/api/v1/resources/tasks", get(admin::tasks))
        .route("/api/v1/consumer-groups", get(admin::list_groups))
        .route("/api/v1/consumer-groups/lagging", get(admin::lagging))
        .route("/api/v1/consumer-groups/{group}", get(admin::get_group).delete(admin::delete_group))
        .route("/api/v1/consumer-groups/{group}/subscription", post(admin::subscription))
        .route("/api/v1/consumer-groups/{group}/queues/{queue}", axum::routing::delete(admin::delete_group_for_queue))
        .route("/api/v1/consumer-groups/{group}/queues/{queue}/seek", post(admin::seek_queue))
        .route("/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek", post(admin::seek_partition))
        .route("/api/v1/stats/refresh", post(admin::refresh_stats))
        .route("/status", get(system::broker_status))
        .route("/api/v1/status", get(admin::status))
        .route("/api/v1/status/buffers", get(system::status_buffers))
        .route("/api/v1/status/queues", get(admin::status_queues))
        .route("/api/v1/status/queues/{queue}", get(admin::status_queue))
        .route("/api/v1/status/queues/{queue}/messages", get(admin::status_queue_messages))
        .route("/api/v1/status/analytics", get(admin::analytics))
        .route("/api/v1/analytics/system-metrics", get(analytics::system_metrics))
        .route("/api/v1/analytics/worker-metrics", get(analytics::worker_metrics))
        .route("/api/v1/analytics/queue-lag", get(analytics::queue_lag))
        .route("/api/v1/analytics/queue-ops", get(analytics::queue_ops))
        .route("/api/v1/analytics/workload", get(analytics::workload))
        .route("/api/v1/analytics/queue-parked-replicas", get(analytics::parked_replicas))
        .route("/api/v1/analytics/retention", get(analytics::retention))
        .route("/api/v1/analytics/dlq-signatures", get(analytics::dlq_signatures))
        .route("/api/v1/analytics/partition-liveness", get(analytics::partition_liveness))
        .route("/api/v1/analytics/postgres-stats", get(analytics::postgres_stats))
        .route("/api/v1/dlq", get(messages::list_dlq).delete(messages::purge_dlq))
        .route("/api/v1/dlq/{id}/replay", post(messages::replay_dlq))
        .route("/api/v1/messages", get(messages::list_messages))
        .route("/api/v1/messages/{partition_id}/{transaction_id}", get(messages::get_message).delete(messages::delete_message))
        .route("/api/v1/messages/{partition_id}/{transaction_id}/retry", post(messages::retry_message))
        .route("/api/v1/fetch", post(reads::fetch))
        .route("/api/v1/partitions/changed", post(reads::partitions_changed))
        .route("/api/v1/traces", post(reads::post_trace))
        .route("/api/v1/traces/names", get(reads::trace_names))
        .route("/api/v1/traces/by-name/{name}", get(reads::traces_by_name))
        .route("/api/v1/traces/{partition_id}/{transaction_id}", get(reads::traces_for_message))
        .route("/api/v1/kv", post(kv::batch))
        .route("/api/v1/kv/{ns}/{*key}", get(kv::get_key).put(kv::put_key).delete(kv::delete_key))
        .route("/api/v1/locks", post(locks::locks))
        .route("/api/v1/consumers", get(kv::consumers))
        .route("/api/v1/timers", post(timers::batch))
        .route("/api/v1/timers/{queue}", get(timers::list))
        .route("/api/v1/timers/{queue}/{*key}", get(timers::peek).delete(timers::cancel))
        .route("/api/v1/resources/kv/namespaces", get(kv::namespaces))
        .route("/api/v1/resources/kv/list", post(kv::list))
        .route("/api/v1/ephemeral/push", post(ephemeral::push))
        .route("/api/v1/ephemeral/pop", get(ephemeral::pop))
        .route("/api/v1/ephemeral/ack", post(ephemeral::ack))
        .route("/api/v1/ephemeral/configure", post(ephemeral::configure))
        .route("/api/v1/ephemeral/reset", post(ephemeral::reset))
        .route("/api/v1/ephemeral/queue/{queue}", axum::routing::delete(ephemeral::delete))
        .route("/api/v1/ephemeral/queues", get(ephemeral::queues))
        .route("/api/v1/ephemeral/queues/{queue}/depth", get(ephemeral::depth))
        .route("/streams/v1/queries", post(streams::register))
        .route("/streams/v1/state/get", post(streams::state_get))
        .route("/streams/v1/cycle", post(streams::cycle))
        .route("/api/v1/system/maintenance", get(system::get_push_maintenance).post(system::set_push_maintenance))
        .route("/api/v1/system/kv-timers", get(system::get_kv_timers).post(system::set_kv_timers))
        .route("/api/v1/system/ephemeral", get(system::get_ephemeral).post(system::set_ephemeral))
        .route("/api/v1/system/brokers", get(system::brokers))
        .route("/api/v1/system/maintenance/pop", get(system::get_pop_maintenance).post(system::set_pop_maintenance))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), front_door))
        .with_state(state)
}

/// Every request passes here once: it is counted and timed, authenticated,
/// then admitted under its family's in-flight cap (so an unauthenticated
/// request never takes a permit), and the permit is held until the answer.
/// One middleware rather than a layer per concern because every layer boxes
/// its own future (~1.3 KB apiece), and a parked long-poll holds all of them
/// for its whole wait: three layers cost 10,000 parked pops 32 MB more RSS.
async fn front_door(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let observed = metrics::Observed::start(&req);
    let response = match auth::check(&state, &mut req).and_then(|()| tenant_of(&state, &mut req)) {
        Err(denied) => denied,
        Ok(()) => match limits::admit(&state, &req) {
            Err(shed) => shed,
            Ok(_permit) => next.run(req).await,
        },
    };
    observed.finish(&state, &response);
    response
}

/// Resolves the request's tenant (`tenancy`) and records any other than
/// the default, which handlers assume when none is recorded.
#[allow(clippy::result_large_err)]
fn tenant_of(state: &AppState, req: &mut Request) -> Result<(), Response> {
    if crate::tenancy::broker_wide(req.uri().path()) {
        return Ok(());
    }
    let aware = crate::tenancy::isolated(req.method(), req.uri().path());
    let tenant = crate::tenancy::resolve(&state.config, aware, req.headers(), req.extensions().get::<auth::Principal>())?;
    if !tenant.is_default() {
        req.extensions_mut().insert(tenant);
    }
    Ok(())
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no such route: {method} {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
