-- The ephemeral queues' kill switch (GET|POST /api/v1/system/ephemeral) is
-- kept beside the KV and timers switches, so every broker honours it. The
-- queues themselves never reach the database: only the switch does.
ALTER TABLE queen.system_switches DROP CONSTRAINT system_switches_name_check;
ALTER TABLE queen.system_switches ADD CONSTRAINT system_switches_name_check CHECK (name IN ('kv', 'timers', 'ephemeral'));
