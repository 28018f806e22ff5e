//! The migration runner: numbered SQL files under `migrations/`, embedded in
//! the binary, each applied exactly once and in order, recorded in
//! `queen.schema_migrations`.
//!
//! Everything runs in one transaction behind a transaction-scoped advisory
//! lock, so two brokers booting at the same moment apply each file once: the
//! second waits, then finds nothing left to do. A landed migration is never
//! edited; a change is a new file.

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
    migration!(1, "0001_log_schema.sql"),
    migration!(2, "0002_push.sql"),
    migration!(3, "0003_pop.sql"),
    migration!(4, "0004_ack.sql"),
    migration!(5, "0005_admin.sql"),
    migration!(6, "0006_maintenance.sql"),
    migration!(7, "0007_push_group.sql"),
    migration!(8, "0008_bulk_reseed.sql"),
    migration!(9, "0009_window0_no_index.sql"),
    migration!(10, "0010_ack_many.sql"),
    migration!(11, "0011_pop_plain_claim.sql"),
    migration!(12, "0012_pop_set_claim.sql"),
    migration!(13, "0013_first_contact.sql"),
    migration!(14, "0014_dedup_purge_marks.sql"),
    migration!(15, "0015_retention_takes_index_entries.sql"),
    migration!(16, "0016_first_contact_seed.sql"),
    migration!(17, "0017_generic_plans.sql"),
    migration!(18, "0018_one_pass_claim_lean_ack.sql"),
    migration!(19, "0019_fenced_ack.sql"),
    migration!(20, "0020_auto_ack_fresh_budget.sql"),
    migration!(21, "0021_configured_queues.sql"),
    migration!(22, "0022_claim_visibility.sql"),
];

/// Arbitrary constant naming the migration lock among advisory locks.
const LOCK_KEY: i64 = 0x5155_4545_4e4d_4947; // "QUEENMIG"

/// Applies every pending migration; returns how many were applied.
pub async fn apply(pool: &Pool) -> Result<usize, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS queen;
         CREATE TABLE IF NOT EXISTS queen.schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await?;
    let applied: Vec<i32> =
        tx.query("SELECT version FROM queen.schema_migrations", &[]).await?.iter().map(|r| r.get(0)).collect();
    let mut count = 0;
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        tracing::info!(version = m.version, name = m.name, "applying migration");
        tx.batch_execute(m.sql).await?;
        tx.execute("INSERT INTO queen.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name])
            .await?;
        count += 1;
    }
    tx.commit().await?;
    Ok(count)
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
}
