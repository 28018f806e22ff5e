-- Push and pop maintenance become cluster-wide (issue 32): kept beside the
-- other switches, as the families 'push' and 'pop' switched off (a row with
-- enabled = false is maintenance on). A change is announced on the brokers'
-- channel (src/cluster.rs), so every broker applies it within a second.
ALTER TABLE queen.system_switches DROP CONSTRAINT system_switches_name_check;
ALTER TABLE queen.system_switches ADD CONSTRAINT system_switches_name_check
    CHECK (name IN ('kv', 'timers', 'ephemeral', 'push', 'pop'));
