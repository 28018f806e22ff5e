-- The brokers on this database (issue 32): each keeps its row fresh once a
-- second from the connection that carries the brokers' push hints
-- (src/cluster.rs), deletes it when it stops, and forgets rows a day old.
-- A broker whose heartbeat is older than five seconds is not live.
CREATE TABLE queen.brokers (
    instance      text PRIMARY KEY,        -- this process (a v7 uuid)
    server_id     text NOT NULL,           -- QUEEN_SERVER_ID / HOSTNAME
    version       text NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL
);
