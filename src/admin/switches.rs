//! Switches kept in the database so that every broker honours them
//! (`queen.system_switches`, migrations/0012): today the KV and timers kill
//! switch of `GET|POST /api/v1/system/kv-timers`. A broker holds the set of
//! families switched off in a [`Reloaded`] copy: the broker that took the
//! request applies it at once, the others at their next reload, and the
//! common case (nothing off) costs one atomic load per request.

use std::collections::HashSet;

use deadpool_postgres::Pool;

use crate::cache::Reloaded;
use crate::db::DbError;

/// The families a switch covers.
pub const FAMILIES: [&str; 2] = ["kv", "timers"];

/// This broker's copy of the families switched off.
#[derive(Default)]
pub struct Switches {
    off: Reloaded<HashSet<String>>,
}

impl Switches {
    /// Whether `family` is switched off.
    pub fn is_off(&self, family: &str) -> bool {
        self.off.read(|s| s.contains(family).then_some(())).is_some()
    }

    /// Persists a switch and applies it here at once.
    pub async fn set(&self, pool: &Pool, family: &'static str, enabled: bool) -> Result<(), DbError> {
        self.set_many(pool, &[(family, enabled)]).await
    }

    /// Sets several switches in one statement: all of them or none (a
    /// `{"enabled": false}` for kv and timers never leaves one of them on).
    pub async fn set_many(&self, pool: &Pool, switches: &[(&'static str, bool)]) -> Result<(), DbError> {
        let names: Vec<&str> = switches.iter().map(|(n, _)| *n).collect();
        let states: Vec<bool> = switches.iter().map(|(_, e)| *e).collect();
        pool.get()
            .await?
            .execute(
                "INSERT INTO queen.system_switches (name, enabled) SELECT * FROM unnest($1::text[], $2::bool[])
                 ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled, updated_at = now()",
                &[&names, &states],
            )
            .await?;
        self.off.change(|s| {
            for (family, enabled) in switches {
                if *enabled {
                    s.remove(*family);
                } else {
                    s.insert(family.to_string());
                }
            }
        });
        Ok(())
    }

    /// Reloads the switches other brokers may have flipped.
    pub async fn refresh(&self, pool: &Pool) -> Result<(), DbError> {
        let since = self.off.generation();
        let rows = pool.get().await?.query("SELECT name FROM queen.system_switches WHERE NOT enabled", &[]).await?;
        self.off.replace_unless_changed(since, rows.iter().map(|r| r.get(0)).collect());
        Ok(())
    }
}
