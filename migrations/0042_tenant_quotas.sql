-- Quotas per tenant (issue 49, src/tenancy/quota.rs): what
-- POST /api/v1/resources/quota stored for a tenant, one row per kind
-- (`queues`: the durable queues' push rate, stored bytes and queue count;
-- `kv`: read and write rates; `ephemeral`: push rate and memory). `limits`
-- holds the fields the route validated: a field present replaces the
-- configured default (JSON null: no limit), a field absent keeps it.
-- `enabled` false refuses the kind to the tenant. Brokers read the table
-- every QUEEN_QUOTA_SAMPLE_MS; enforcement itself never reads it.
CREATE TABLE queen.tenant_quotas (
    tenant_id   uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('queues', 'kv', 'ephemeral')),
    enabled     boolean NOT NULL DEFAULT true,
    limits      jsonb NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, kind)
);
