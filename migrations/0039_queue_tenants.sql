-- Every queue belongs to a tenant (issue 49, src/tenancy.rs).
--
-- A tenant's queue is stored under its name behind the tenant's prefix:
-- chr(1), the tenant's UUID, chr(1), then the name the tenant gave. No name
-- a client gives can hold a control character, so the default tenant's
-- names (stored as given: every queue that existed before this migration)
-- can never spell another tenant's prefix, and `name` stays unique across
-- tenants, which is (tenant, name) unique. The broker maps names at its
-- edge; everything keyed by a queue's name or id (partitions, cursors,
-- segments, dedup, caches, rings, wake gates) is per tenant through it.
--
-- tenant_id is that prefix read back, generated so that it can never
-- disagree with the name: listings and usage filter and group by it. The
-- table is small (one row a queue); adding a stored generated column
-- rewrites it, which at 10,000 queues is milliseconds.

ALTER TABLE queen.queues
    ADD COLUMN tenant_id uuid NOT NULL GENERATED ALWAYS AS (
        CASE WHEN left(name, 1) = chr(1) AND substr(name, 38, 1) = chr(1)
             THEN substr(name, 2, 36)::uuid
             ELSE '00000000-0000-0000-0000-000000000001'::uuid END) STORED;

CREATE INDEX queues_tenant ON queen.queues (tenant_id, name);
