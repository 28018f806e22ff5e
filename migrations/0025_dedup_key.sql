-- The key of the transactionId hash (issue 45): deduplication decides by a
-- 64-bit hash of the id, and an unkeyed hash lets a producer craft an id that
-- collides with another producer's, whose message is then answered
-- "duplicate" and dropped. Every broker of this database keys its hash
-- (SipHash-1-3, `log::TxnHasher`) with this one secret, so they agree with
-- each other and with the hashes stored in `segments.txn_hashes`, and no
-- client can predict them.
--
-- Sixteen bytes from two v4 UUIDs (pg_strong_random) through SHA-256. Written
-- once, here; never rotated (the stored hashes are keyed with it).
--
-- Hashes written before this migration were unkeyed (xxh3): a retry, inside
-- the dedup window, of a message pushed before the upgrade is not recognised
-- as a repeat, and an older broker sharing the database during a rolling
-- upgrade does not see the newer brokers' ids as repeats (nor they its).
-- Acks by transactionId are unaffected: they fall back to comparing the
-- decoded ids around the cursor.
CREATE TABLE queen.dedup_key (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key         bytea NOT NULL CHECK (length(key) = 16),
    created_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.dedup_key (key)
SELECT substring(sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())) FROM 1 FOR 16);
