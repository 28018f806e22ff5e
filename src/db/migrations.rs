//! The migration runner: numbered SQL files under `migrations/`, embedded in
//! the binary, each applied exactly once and in order, recorded in
//! `queen.schema_migrations`.
//!
//! Everything runs in one transaction behind a transaction-scoped advisory
//! lock, so two brokers booting at the same moment apply each file once: the
//! second waits, then finds nothing left to do. A landed migration is never
//! edited; a change is a new file.
//!
//! The first six files are a baseline (later ones are changes on top of it,
//! 0007 the first): the unreleased development history (22
//! migrations) was squashed into its live objects once. A database that
//! recorded a migration this list does not hold (that history, or a newer
//! broker's schema) is refused with one line saying what to do, rather than
//! patched over; `queen migrate --reset --yes` (`reset`) drops and recreates
//! the schema.

use deadpool_postgres::Pool;

use super::DbError;

/// One schema change.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:expr, $file:literal) => {
        Migration { version: $version, name: $file, sql: include_str!(concat!("../../migrations/", $file)) }
    };
}

/// Every migration, in order. A unit test checks this list against the folder.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_schema.sql"),
    migration!(2, "0002_push.sql"),
    migration!(3, "0003_pop.sql"),
    migration!(4, "0004_ack.sql"),
    migration!(5, "0005_admin.sql"),
    migration!(6, "0006_maintenance.sql"),
    migration!(7, "0007_encryption_and_eviction.sql"),
    migration!(8, "0008_traces.sql"),
    migration!(9, "0009_broker_samples.sql"),
    migration!(10, "0010_kv.sql"),
    migration!(11, "0011_locks.sql"),
    migration!(12, "0012_system_switches.sql"),
    migration!(13, "0013_timers.sql"),
    migration!(14, "0014_kv_contention.sql"),
    migration!(15, "0015_streams.sql"),
    migration!(16, "0016_ephemeral_switch.sql"),
    migration!(17, "0017_brokers.sql"),
    migration!(18, "0018_cluster_switches.sql"),
    migration!(19, "0019_dedup_in_segments.sql"),
    migration!(20, "0020_lock_retries.sql"),
    migration!(21, "0021_eviction_without_cursor.sql"),
    migration!(22, "0022_push_function_names.sql"),
    migration!(23, "0023_lock_subjects.sql"),
    migration!(24, "0024_sealed_timers.sql"),
    migration!(25, "0025_dedup_key.sql"),
    migration!(26, "0026_kafka_topics.sql"),
    migration!(27, "0027_kv_shared_writes.sql"),
    migration!(28, "0028_ack_handover.sql"),
    migration!(29, "0029_partition_probe.sql"),
    migration!(30, "0030_reseed_window.sql"),
    migration!(31, "0031_cursor_lag_by_cursor.sql"),
    migration!(32, "0032_retention_walk.sql"),
    migration!(33, "0033_pending_holds_a_message.sql"),
    migration!(34, "0034_push_across_queues.sql"),
    migration!(35, "0035_claim_reports_the_tail.sql"),
    migration!(36, "0036_kafka_producers.sql"),
    migration!(37, "0037_kafka_transactions.sql"),
    migration!(38, "0038_kafka_transactional_id_expiry.sql"),
    migration!(39, "0039_queue_tenants.sql"),
    migration!(40, "0040_lock_namespaces.sql"),
    migration!(41, "0041_tenant_discovery.sql"),
    migration!(42, "0042_tenant_quotas.sql"),
    migration!(43, "0043_kafka_producer_tenants.sql"),
    migration!(44, "0044_kv_put_many.sql"),
    migration!(45, "0045_push_known_segments.sql"),
    migration!(46, "0046_first_contact_seeds_in_chunks.sql"),
    migration!(47, "0047_ack_skips_handover_lookups.sql"),
    migration!(48, "0048_pops_share_a_claim.sql"),
    migration!(49, "0049_claims_skip_cached_segments.sql"),
    migration!(50, "0050_shared_claims_as_a_set.sql"),
    migration!(51, "0051_one_partition_claims_in_one_statement.sql"),
];

/// The first migration of the development history squashed into the
/// baseline (docs/DECISIONS.md, "One baseline schema"): a database that
/// recorded it holds the old schema.
const PRE_BASELINE: &str = "0001_log_schema.sql";

/// Arbitrary constant naming the migration lock among advisory locks.
const LOCK_KEY: i64 = 0x5155_4545_4e4d_4947; // "QUEENMIG"

/// Applies every pending migration; returns how many were applied.
pub async fn apply(pool: &Pool) -> Result<usize, DbError> {
    migrate(pool, false).await
}

/// `queen migrate --reset --yes`: drops the `queen` schema with everything
/// in it and applies the migrations afresh, in the same transaction behind
/// the migration lock, so a failed reset leaves the old schema in place.
/// Returns how many migrations were applied.
pub async fn reset(pool: &Pool) -> Result<usize, DbError> {
    migrate(pool, true).await
}

/// One migration transaction: the lock, `reset`'s drop when asked, the
/// refusal of an unknown schema, then every pending file.
async fn migrate(pool: &Pool, drop_first: bool) -> Result<usize, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    if drop_first {
        tx.batch_execute("DROP SCHEMA IF EXISTS queen CASCADE").await?;
    }
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS queen;
         CREATE TABLE IF NOT EXISTS queen.schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await?;
    let applied: Vec<(i32, String)> = tx
        .query("SELECT version, name FROM queen.schema_migrations ORDER BY version", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if let Some(refusal) = unknown_schema(&applied) {
        return Err(DbError::Schema(refusal));
    }
    let mut count = 0;
    for m in MIGRATIONS.iter().filter(|m| !applied.iter().any(|(v, _)| *v == m.version)) {
        tracing::info!(version = m.version, name = m.name, "applying migration");
        tx.batch_execute(m.sql).await?;
        tx.execute("INSERT INTO queen.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name])
            .await?;
        count += 1;
    }
    tx.commit().await?;
    Ok(count)
}

/// Why a database whose `schema_migrations` holds `applied` cannot be served
/// by this broker, if it cannot: a migration recorded under a name this
/// list does not give its version.
fn unknown_schema(applied: &[(i32, String)]) -> Option<String> {
    let (version, name) = applied
        .iter()
        .find(|(v, n)| !MIGRATIONS.iter().any(|m| m.version == *v && m.name == n))?;
    let reset = "start on a fresh QUEEN_DATA_DIR (or an empty database), or run `queen migrate --reset --yes` \
                 to drop and recreate the queen schema, deleting every queue and message in it";
    Some(if name == PRE_BASELINE {
        format!("this database holds the pre-baseline Queen schema (migration {name}); {reset}")
    } else {
        format!("this database holds a Queen schema this broker does not know (migration {version} {name}); \
                 run the broker that wrote it, or {reset}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_matches_the_folder_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
        assert_eq!(files, listed);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)));
        }
    }

    #[test]
    fn a_database_of_another_schema_is_refused_with_what_to_do() {
        let ours: Vec<(i32, String)> = MIGRATIONS.iter().map(|m| (m.version, m.name.to_string())).collect();
        assert_eq!(unknown_schema(&ours), None);
        assert_eq!(unknown_schema(&ours[..2]), None, "an older baseline database is migrated forward");
        let old = unknown_schema(&[(1, PRE_BASELINE.into()), (2, "0002_push.sql".into())]).unwrap();
        assert!(old.contains("pre-baseline") && old.contains("queen migrate --reset --yes") && old.contains("QUEEN_DATA_DIR"), "{old}");
        let newer = unknown_schema(&[(1, "0001_schema.sql".into()), (99, "0099_later.sql".into())]).unwrap();
        assert!(newer.contains("migration 99 0099_later.sql"), "{newer}");
    }

    /// Every stored function a migration defines is called: by the broker
    /// (a `queen.<name>` in its source), by a trigger, or by another live
    /// function. A function nothing reaches is dead schema a reader has to
    /// rule out; drop it in the migration that replaces it.
    #[test]
    fn every_function_a_migration_defines_is_called() {
        let defined = function_definitions();
        assert!(defined.len() > 20, "the scan found the functions: {:?}", defined.keys());
        let mut live: Vec<String> = referenced(&rust_sources()).into_iter().filter(|n| defined.contains_key(n)).collect();
        for m in MIGRATIONS {
            for line in m.sql.lines().filter(|l| l.contains("EXECUTE FUNCTION")) {
                live.extend(referenced(line));
            }
        }
        // Called only by brokers of the previous version during a rolling
        // upgrade (0022_push_function_names.sql keeps them as wrappers;
        // 0023_lock_subjects.sql keeps the subject-less lock functions,
        // 0024_sealed_timers.sql the schedule that cannot seal,
        // 0028_ack_handover.sql the plain ack without the handover,
        // 0030_reseed_window.sql the reseed of whole queues, 0038 the
        // producer expiry with one idleness, 0040 the locks of one namespace,
        // 0041 the discovery across tenants, 0043 the Kafka producers of
        // no tenant, 0046 the first contact that covers the whole queue,
        // 0049 the shared claim that ships every blob, 0050 the shared claim
        // that runs slot by slot).
        live.extend(
            ["push_segments_v2", "push_segment_v1", "lock_acquire_v1", "lock_holders_v1", "timer_schedule_v1", "ack_completed_many_v1",
             "hotlist_seed_many_v1", "kafka_producers_expire_v1", "lock_acquire_v2", "lock_holders_v2",
             "pop_discover_v1", "kafka_init_producer_v1", "kafka_init_transactional_v1", "kafka_produce_begin_v1",
             "first_contact_v1", "pop_list_shared_v1", "pop_list_shared_v2"]
                .map(String::from),
        );
        let mut i = 0;
        while i < live.len() {
            let body = &defined[&live[i]];
            for n in referenced(body) {
                if defined.contains_key(&n) && !live.contains(&n) {
                    live.push(n);
                }
            }
            i += 1;
        }
        let mut dead: Vec<&String> = defined.keys().filter(|n| !live.contains(n)).collect();
        dead.sort();
        assert!(dead.is_empty(), "defined by a migration and called by nothing: {dead:?}");
    }

    /// Each function's name and its latest definition's text (a function a
    /// later migration drops is gone).
    fn function_definitions() -> std::collections::HashMap<String, String> {
        let mut defs = std::collections::HashMap::new();
        for m in MIGRATIONS {
            let mut rest = m.sql;
            while let Some(at) = rest.find("FUNCTION queen.") {
                let after = &rest[at + "FUNCTION queen.".len()..];
                let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let before = rest[..at].trim_end();
                if before.ends_with("DROP") {
                    // Replaced by a later migration: no longer defined.
                    defs.remove(&name);
                    rest = &after[name.len()..];
                    continue;
                }
                if !(before.ends_with("CREATE") || before.ends_with("OR REPLACE")) {
                    // ALTER FUNCTION, EXECUTE FUNCTION: not a definition.
                    rest = &after[name.len()..];
                    continue;
                }
                // The body runs to the second `$$` after the name.
                let end = after.match_indices("$$").nth(1).map(|(i, _)| i + 2).expect("a function body");
                defs.insert(name, after[..end].to_string());
                rest = &after[end..];
            }
        }
        defs
    }

    /// The names `text` calls as `queen.<name>(` (a mention in prose, with no
    /// parenthesis right after the name, is not a call).
    fn referenced(text: &str) -> Vec<String> {
        text.match_indices("queen.")
            .filter_map(|(i, _)| {
                let after = &text[i + "queen.".len()..];
                let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                after[name.len()..].starts_with('(').then_some(name)
            })
            .collect()
    }

    /// The broker's Rust source, every file under src/.
    fn rust_sources() -> String {
        fn walk(dir: &std::path::Path, out: &mut String) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("db/migrations.rs") {
                    out.push_str(&std::fs::read_to_string(&p).unwrap());
                }
            }
        }
        let mut out = String::new();
        walk(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")), &mut out);
        out
    }
}
