//! The metrics sampler: once a minute, each broker writes the per-queue
//! traffic it saw since the last sample into `queen.metrics_samples` (the
//! analytics routes sum across brokers), and trims samples older than
//! `METRICS_RETENTION_DAYS`.

use deadpool_postgres::Pool;

use crate::db::DbError;
use crate::metrics::Telemetry;

/// Writes one sample; deltas that cannot be written are kept for the next.
pub async fn tick(pool: &Pool, telemetry: &Telemetry, broker: &str, retention_days: i32) -> Result<bool, DbError> {
    let deltas = telemetry.take_deltas();
    let write = async {
        let client = pool.get().await?;
        if !deltas.is_empty() {
            let names: Vec<&str> = deltas.keys().map(String::as_str).collect();
            let col = |i: usize| -> Vec<i64> { names.iter().map(|n| deltas[*n][i] as i64).collect() };
            client
                .execute(
                    "INSERT INTO queen.metrics_samples (sampled_at, queue_name, broker, pushed, popped, acked)
                     SELECT date_trunc('minute', now()), q, $2, pu, po, ac
                     FROM unnest($1::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS t (q, pu, po, ac)",
                    &[&names, &broker, &col(0), &col(1), &col(2)],
                )
                .await?;
        }
        client
            .execute("DELETE FROM queen.metrics_samples WHERE sampled_at < now() - make_interval(days => $1)", &[&retention_days])
            .await?;
        Ok::<_, DbError>(())
    };
    match write.await {
        Ok(()) => Ok(false),
        Err(e) => {
            telemetry.restore_deltas(deltas);
            Err(e)
        }
    }
}
