//! Boot and shutdown of one broker process.
//!
//! Boot: resolve the database (starting the embedded cluster when none is
//! configured), build the pool, apply migrations, bind, serve. Shutdown, on
//! SIGINT or SIGTERM: stop accepting, let in-flight requests finish (a push
//! answers only after its commit), wait for every coalescer lane to drain,
//! then stop the embedded cluster.

use std::sync::Arc;
use std::time::Duration;

use crate::ack::AckService;
use crate::registry::AckRegistry;
use crate::config::{Config, Database};
use crate::db;
use crate::embedded_pg::EmbeddedCluster;
use crate::http::{router, AppState};
use crate::pop::PopService;
use crate::push::Coalescer;
use tokio::sync::broadcast;

/// A boot failure: printed as one line, exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error(transparent)]
    Embedded(#[from] crate::embedded_pg::EmbeddedError),
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server: {0}")]
    Serve(std::io::Error),
    /// A destructive command run without its confirmation.
    #[error("{0}")]
    Unconfirmed(String),
}

/// The database the broker talks to, with the embedded cluster when it owns one.
struct Store {
    pool: deadpool_postgres::Pool,
    /// What the pool connects with (the brokers' hint channel opens its own
    /// connection with it).
    target: db::Target,
    embedded: Option<Arc<EmbeddedCluster>>,
}

async fn open_store(config: &Config) -> Result<Store, BootError> {
    let (target, embedded) = match &config.database {
        Database::Embedded { data_dir } => {
            let dir = data_dir.clone();
            let cluster = tokio::task::spawn_blocking(move || EmbeddedCluster::start(&dir))
                .await
                .expect("embedded cluster start does not panic")?;
            (db::Target::plain(cluster.pg_config()), Some(Arc::new(cluster)))
        }
        other => (db::pg_config(other)?, None),
    };
    let settings = db::PoolSettings { size: config.pool_size, wait: config.pool_wait, statement_timeout: config.statement_timeout };
    let pool = db::pool(settings, target.clone())?;
    Ok(Store { pool, target, embedded })
}

impl Store {
    async fn stop(self) {
        self.pool.close();
        if let Some(cluster) = self.embedded {
            let r = tokio::task::spawn_blocking(move || cluster.stop()).await;
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "embedded PostgreSQL did not stop cleanly");
            }
        }
    }
}

/// Applies migrations, retrying for a while so that a broker started
/// alongside its database waits for it instead of dying.
async fn migrate_with_retry(pool: &deadpool_postgres::Pool) -> Result<(), db::DbError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match db::migrations::apply(pool).await {
            Ok(n) => {
                tracing::info!(applied = n, "schema up to date");
                return Ok(());
            }
            Err(e) if tokio::time::Instant::now() < deadline && is_connection_error(&e) => {
                tracing::warn!(error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_connection_error(e: &db::DbError) -> bool {
    matches!(e, db::DbError::Pool(_)) || e.unavailable()
}

/// `queen migrate`: apply the schema and exit.
pub async fn migrate(config: Config) -> Result<(), BootError> {
    let store = open_store(&config).await?;
    let r = migrate_with_retry(&store.pool).await;
    store.stop().await;
    Ok(r?)
}

/// `queen serve`: run until SIGINT or SIGTERM.
pub async fn serve(config: Config) -> Result<(), BootError> {
    let store = open_store(&config).await?;
    match run(config, &store).await {
        Ok(()) => {
            store.stop().await;
            tracing::info!("shutdown complete");
            Ok(())
        }
        Err(e) => {
            store.stop().await;
            Err(e)
        }
    }
}

async fn run(config: Config, store: &Store) -> Result<(), BootError> {
    if config.apply_schema {
        migrate_with_retry(&store.pool).await?;
    }
    let addr = format!("{}:{}", config.host, config.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| BootError::Bind { addr: addr.clone(), source })?;
    let local = listener.local_addr().map_err(BootError::Serve)?;
    let kafka_listener = crate::kafka::bind(&config.kafka)
        .await
        .map_err(|source| BootError::Bind { addr: config.kafka.listen.clone(), source })?;
    let encryption = crate::crypto::Encryption::new(config.encryption.as_ref());
    // Before the first push: a broker that has not loaded which queues
    // encrypt would write their payloads in the clear (one with a key: its
    // boot needs the database), or not know to refuse them (one without: it
    // boots anyway, to answer /health and spool, and loads the set at the
    // next cache refresh; docs/DECISIONS.md "Hardening").
    if let Err(e) = crate::admin::configure::refresh_encrypted(&store.pool, &encryption).await {
        if encryption.ring().is_some() {
            return Err(e.into());
        }
        tracing::warn!(error = %e, "could not read which queues encrypt; retried every QUEEN_CACHE_REFRESH_INTERVAL_MS");
    }
    if let Some(ring) = encryption.ring() {
        tracing::info!(key = %ring.current_id(), "encryption at rest: payloads of queues with encryptionEnabled are sealed under this key");
    }
    let coalescer = Coalescer::new(store.pool.clone(), config.coalesce.clone(), encryption.clone());
    let registry = Arc::new(AckRegistry::new(config.ack_registry_bytes));
    let pop = PopService::new(store.pool.clone(), config.pop.clone(), config.pool_size, config.pool_wait, registry.clone(), encryption.clone());
    let ack = Arc::new(AckService::new(store.pool.clone(), registry, config.ack_writers, pop.handover.clone()));
    let (stop_services, _) = broadcast::channel(1);
    pop.wake.spawn_ticker(stop_services.subscribe());
    pop.spawn_wheel(stop_services.subscribe());
    if config.pop.hotlist {
        pop.spawn_reseeder(stop_services.subscribe());
    }
    // Per-queue settings cached in the broker, reloaded for changes made
    // through other brokers.
    let (p, settings) = (store.pool.clone(), pop.settings.clone());
    crate::maintenance::spawn_service("queue_settings", config.queue_cache_refresh, stop_services.subscribe(), move || {
        let (p, settings) = (p.clone(), settings.clone());
        async move { settings.refresh(&p).await.map(|()| false) }
    });
    let (p, sealing) = (store.pool.clone(), encryption.clone());
    crate::maintenance::spawn_service("encrypted_queues", config.queue_cache_refresh, stop_services.subscribe(), move || {
        let (p, sealing) = (p.clone(), sealing.clone());
        async move { crate::admin::configure::refresh_encrypted(&p, &sealing).await.map(|()| false) }
    });
    let switches = Arc::new(crate::admin::switches::Switches::default());
    if let Err(e) = switches.refresh(&store.pool).await {
        tracing::warn!(error = %e, "could not read the system switches; retrying on the cache refresh");
    }
    // Push and pop maintenance are switches too: what the database says at
    // boot, then what each refresh says (cluster-wide, issue 32).
    let push_maintenance = Arc::new(std::sync::atomic::AtomicBool::new(switches.is_off("push")));
    pop.set_maintenance(switches.is_off("pop"));
    let (p, sw, pm, pops) = (store.pool.clone(), switches.clone(), push_maintenance.clone(), pop.clone());
    crate::maintenance::spawn_service("system_switches", config.queue_cache_refresh, stop_services.subscribe(), move || {
        let (p, sw, pm, pops) = (p.clone(), sw.clone(), pm.clone(), pops.clone());
        async move { reread_switches(&p, &sw, &pm, &pops).await.map(|()| false) }
    });
    spawn_maintenance(&config, &store.pool, &stop_services);
    spawn_pool_reaper(store.pool.clone(), config.pool_idle, stop_services.subscribe());
    let spool = match crate::push::spool::SpoolOwner::of(&store.pool)
        .await
        .map_err(|e| crate::push::spool::SpoolError::Push(format!("which database this is: {e}")))
        .and_then(|owner| crate::push::spool::Spool::open(&config.file_buffer_dir, owner, encryption.clone()))
    {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::warn!(dir = %config.file_buffer_dir.display(), error = %e,
                           "FILE_BUFFER_DIR is not usable: push maintenance and outage spooling are off");
            None
        }
    };
    // The log's gauges, which read the spool too (so they start after it).
    let (p, gauge_spool, walk) = (store.pool.clone(), spool.clone(), Arc::new(std::sync::Mutex::new(crate::maintenance::gauges::Walk::default())));
    let window = config.maintenance_window;
    crate::maintenance::spawn_walk_service("gauges", config.stats_interval, crate::maintenance::gauges::SHARE, stop_services.subscribe(), move || {
        let (p, gauge_spool, walk) = (p.clone(), gauge_spool.clone(), walk.clone());
        async move { crate::maintenance::gauges::tick(&p, gauge_spool.as_ref(), &walk, window).await }
    });
    // Quotas: read before the first request, then every QUEEN_QUOTA_SAMPLE_MS.
    let quotas = Arc::new(crate::tenancy::quota::Quotas::new(config.tenancy.quotas));
    if let Err(e) = quotas.sample(&store.pool).await {
        tracing::warn!(error = %e, "could not read the tenants' quotas; retrying on the next sample");
    }
    let (p, q) = (store.pool.clone(), quotas.clone());
    crate::maintenance::spawn_service("quotas", config.tenancy.quota_sample, stop_services.subscribe(), move || {
        let (p, q) = (p.clone(), q.clone());
        async move { q.sample(&p).await.map(|()| false) }
    });
    let flush_every = config.file_buffer_flush;
    let config_limits = config.limits.clone();
    let config_ephemeral = config.ephemeral.clone();
    let config_kv = config.kv.clone();
    crate::http::body::set_body_timeout(config.limits.body_timeout);
    let cluster = if config.peer_hints {
        crate::cluster::Cluster::spawn(store.target.clone(), pop.clone(), config.server_id.clone(), stop_services.subscribe())
    } else {
        Arc::new(crate::cluster::Cluster::silent())
    };
    let cluster_end = cluster.clone();
    let state = AppState::new(crate::http::Shared { config: Arc::new(config), cluster, pool: store.pool.clone(), coalescer: coalescer.clone(), pop: pop.clone(), ack,
        telemetry: crate::metrics::Telemetry::global(), spool,
        push_maintenance: push_maintenance.clone(),
        inflight: Arc::new(crate::http::limits::InFlight::new(&config_limits)),
        traces: crate::reads::traces::TraceWriter::new(store.pool.clone()), switches,
        kv: crate::kv::KvWriter::new(store.pool.clone(), config_kv.limits.clone(), config_kv.writers),
        ephemeral: Arc::new(crate::ephemeral::Ephemeral::new(config_ephemeral)),
        owners: Arc::new(crate::tenancy::Owners::default()), quotas });
    spawn_spool_replayer(state.clone(), flush_every, stop_services.subscribe());
    spawn_timer_fire(state.clone(), stop_services.subscribe());
    spawn_ephemeral_sweeper(state.ephemeral.clone(), stop_services.subscribe());
    spawn_reloader(state.clone(), encryption.clone(), stop_services.subscribe());
    // Stops the Kafka listener when HTTP stops taking requests.
    let (stop_kafka, _) = broadcast::channel(1);
    if let Some(l) = kafka_listener {
        crate::kafka::spawn(state.clone(), l, stop_kafka.clone()).await;
    }
    tracing::info!(%local, "listening on http://{local}");
    let signal = {
        let pop = pop.clone();
        async move {
            shutdown_signal().await;
            let _ = stop_kafka.send(());
            // Parked long-polls answer now, so in-flight requests finish promptly.
            pop.close();
        }
    };
    let connection_limits = crate::http::server::ConnectionLimits {
        max_connections: config_limits.max_connections,
        header_timeout: config_limits.header_timeout,
    };
    crate::http::server::serve(listener, router(state), connection_limits, signal).await;
    tracing::info!("HTTP server stopped; flushing pending writes");
    coalescer.drain(Duration::from_secs(30)).await;
    let _ = stop_services.send(());
    cluster_end.stopped(Duration::from_secs(2)).await;
    Ok(())
}

/// Replays the push spool whenever it has work and maintenance is off
/// (including at boot, for files an earlier run left).
fn spawn_spool_replayer(state: AppState, every: Duration, mut shutdown: broadcast::Receiver<()>) {
    if state.spool.is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => state.replay_spool().await,
                _ = shutdown.recv() => return,
            }
        }
    });
}

/// Fires due timers (`timers::fire`) every `QUEEN_TIMERS_INTERVAL_MS`, at
/// once again while batches come back full, and wakes the consumers of what
/// it pushed.
/// Rereads the switches and applies the two that live in other services'
/// flags (push and pop maintenance).
async fn reread_switches(
    pool: &deadpool_postgres::Pool,
    switches: &crate::admin::switches::Switches,
    push_maintenance: &std::sync::atomic::AtomicBool,
    pop: &PopService,
) -> Result<(), crate::db::DbError> {
    switches.refresh(pool).await?;
    push_maintenance.store(switches.is_off("push"), std::sync::atomic::Ordering::SeqCst);
    pop.set_maintenance(switches.is_off("pop"));
    Ok(())
}

/// When another broker announces a change (a switch, a queue's settings),
/// rereads the switches and the cached per-queue settings at once instead
/// of at the next cache refresh.
fn spawn_reloader(state: AppState, encryption: Arc<crate::crypto::Encryption>, mut shutdown: broadcast::Receiver<()>) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = state.cluster.reloads.notified() => {}
                _ = shutdown.recv() => return,
            }
            let switched = reread_switches(&state.pool, &state.switches, &state.push_maintenance, &state.pop).await;
            let settings = state.pop.settings.refresh(&state.pool).await;
            let sealing = crate::admin::configure::refresh_encrypted(&state.pool, &encryption).await;
            for e in [switched.err(), settings.err(), sealing.err()].into_iter().flatten() {
                tracing::warn!(error = %e, "rereading what another broker changed failed; the cache refresh will");
            }
        }
    });
}

/// Once a second: ephemeral messages past their TTL, idle groups and idle
/// implicit queues go, and the ephemeral gauges are set.
fn spawn_ephemeral_sweeper(ephemeral: Arc<crate::ephemeral::Ephemeral>, mut shutdown: broadcast::Receiver<()>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => ephemeral.sweep(),
                _ = shutdown.recv() => return,
            }
        }
    });
}

fn spawn_timer_fire(state: AppState, mut shutdown: broadcast::Receiver<()>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(state.config.timers_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.recv() => return,
            }
            for _ in 0..100 {
                match crate::timers::fire::tick(&state.pool, &state.coalescer, state.config.timers_batch).await {
                    Ok((pushed, more)) => {
                        for (queue, pid, partition, n) in &pushed {
                            state.committed_push(queue, *pid, partition, *n);
                        }
                        if !more {
                            break;
                        }
                    }
                    Err(e) => {
                        static FAILED: crate::telemetry::Throttle = crate::telemetry::Throttle::new(5_000);
                        if let Some(skipped) = FAILED.admit() {
                            tracing::warn!(error = %e, skipped, "timer fire failed; retrying next tick");
                        }
                        break;
                    }
                }
            }
        }
    });
}

/// Closes pooled connections idle longer than `idle`, so a burst does not
/// leave its connections (and PostgreSQL backends) behind for good.
fn spawn_pool_reaper(pool: deadpool_postgres::Pool, idle: Duration, mut shutdown: broadcast::Receiver<()>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval((idle / 3).max(Duration::from_millis(100)));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let r = pool.retain(|_, m| m.last_used() < idle);
                    if !r.removed.is_empty() {
                        tracing::debug!(closed = r.removed.len(), "closed idle database connections");
                    }
                }
                _ = shutdown.recv() => return,
            }
        }
    });
}

/// The background services, each with the shutdown signal.
fn spawn_maintenance(config: &Config, pool: &deadpool_postgres::Pool, stop: &broadcast::Sender<()>) {
    use crate::maintenance::{analyze, dedup_purge, eviction, metrics_sampler, partition_cleanup, retention, spawn_service};
    if let Some(every) = config.analyze_interval {
        let p = pool.clone();
        spawn_service("analyze", every, stop.subscribe(), move || {
            let p = p.clone();
            async move { analyze::tick(&p).await }
        });
    }
    if let Some(idle) = config.partition_cleanup {
        let (p, batch) = (pool.clone(), config.retention_batch);
        spawn_service("partition_cleanup", config.retention_interval, stop.subscribe(), move || {
            let p = p.clone();
            async move { partition_cleanup::tick(&p, idle, batch).await }
        });
    }
    let (p, batch) = (pool.clone(), config.retention_batch);
    spawn_service("retention", config.retention_interval, stop.subscribe(), move || {
        let p = p.clone();
        async move { retention::tick(&p, batch).await }
    });
    let (p, batch, walk, window) = (pool.clone(), config.retention_batch as i64, Arc::new(std::sync::atomic::AtomicI64::new(0)), config.maintenance_window);
    spawn_service("dedup_purge", config.retention_interval, stop.subscribe(), move || {
        let (p, walk) = (p.clone(), walk.clone());
        async move { dedup_purge::tick(&p, batch, &walk, window).await }
    });
    let (p, days, batch) = (pool.clone(), config.traces_retention_days, config.retention_batch);
    spawn_service("trace_sweeper", config.retention_interval, stop.subscribe(), move || {
        let p = p.clone();
        async move { crate::maintenance::traces::tick(&p, days, batch).await }
    });
    let (p, batch) = (pool.clone(), config.retention_batch);
    spawn_service("kv_expiry", config.kv.sweep_interval, stop.subscribe(), move || {
        let p = p.clone();
        async move { crate::maintenance::kv_expiry::tick(&p, batch).await }
    });
    let (p, batch) = (pool.clone(), config.eviction_batch);
    spawn_service("eviction", config.eviction_interval, stop.subscribe(), move || {
        let p = p.clone();
        async move { eviction::tick(&p, batch).await }
    });
    // The recorder frees histogram samples only when it folds them in.
    spawn_service("metrics_upkeep", crate::metrics::UPKEEP_EVERY, stop.subscribe(), || async {
        crate::metrics::Telemetry::global().upkeep();
        Ok(false)
    });
    let p = pool.clone();
    let sampler = Arc::new(metrics_sampler::Sampler::new(config.server_id.clone(), config.metrics_retention_days));
    spawn_service("metrics_sampler", config.metrics_flush, stop.subscribe(), move || {
        let (p, sampler) = (p.clone(), sampler.clone());
        async move { sampler.tick(&p, &crate::metrics::Telemetry::global()).await }
    });
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// `queen migrate --reset`: with `yes`, drop the `queen` schema and apply
/// the migrations afresh; without it, say what would be lost and change
/// nothing.
pub async fn reset(config: Config, yes: bool) -> Result<(), BootError> {
    let target = match &config.database {
        Database::Embedded { data_dir } => format!("the embedded cluster in {}", data_dir.display()),
        _ => "the configured database".to_string(),
    };
    if !yes {
        return Err(BootError::Unconfirmed(format!(
            "--reset drops the queen schema of {target}, with every queue, message and cursor in it; \
             run `queen migrate --reset --yes` to do it"
        )));
    }
    let store = open_store(&config).await?;
    let r = db::migrations::reset(&store.pool).await;
    store.stop().await;
    let applied = r?;
    tracing::warn!(applied, "queen schema dropped and recreated");
    Ok(())
}
