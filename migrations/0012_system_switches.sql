-- Switches an operator flips for every broker on the database at once
-- (issue 29 §4: the KV and timers kill switch). A row says a family is off;
-- no row, on. Brokers read the table on QUEEN_CACHE_REFRESH_INTERVAL_MS; the
-- broker that took the request applies it at once.
CREATE TABLE queen.system_switches (
    name        text PRIMARY KEY CHECK (name IN ('kv', 'timers')),
    enabled     boolean NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
