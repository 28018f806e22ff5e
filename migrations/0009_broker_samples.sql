-- Per-broker system figures, one row per broker per sample (the metrics
-- sampler's cadence, METRICS_FLUSH_MS), read by the analytics routes
-- system-metrics, worker-metrics and queue-parked-replicas and trimmed
-- with the traffic samples after METRICS_RETENTION_DAYS. Every broker on
-- the database writes its own rows, so a reader sees all of them.
CREATE TABLE queen.broker_samples (
    sampled_at           timestamptz NOT NULL DEFAULT now(),
    broker               text NOT NULL,
    rss_bytes            bigint NOT NULL,
    -- CPU used since the previous sample, as a percentage of one core.
    cpu_percent          double precision NOT NULL,
    requests_per_second  double precision NOT NULL,
    -- The database pool: connections open, in use, requests waiting.
    pool_size            integer NOT NULL,
    pool_in_use          integer NOT NULL,
    pool_waiting         integer NOT NULL,
    parked_long_polls    bigint NOT NULL,
    uptime_seconds       bigint NOT NULL
);
CREATE INDEX broker_samples_at ON queen.broker_samples (sampled_at);
