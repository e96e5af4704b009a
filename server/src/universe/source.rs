//! The source universe: one connection to the database whose outbox is delivered, and the pack's
//! universe functions (009_universe.sql) called over it. The semantics are the pack's; this only
//! converts between SQL rows and the engine's types.

use std::time::Duration;

use kizuna_engine::universe::{EventState, Update};
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::db;

pub struct Source {
    client: Client,
}

impl Source {
    /// Connects to the source (retrying while it comes up, up to `timeout`) and checks that the
    /// pack with its universe outbox is installed there.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Source, String> {
        let config = db::parse_url(url).map_err(|e| e.replace("--database-url", "--source"))?;
        let client = db::connect_with_retry(&config, timeout).await?;
        let installed: bool = client
            .query_one("select to_regprocedure('kizuna.universe_window(bigint, integer)') is not null", &[])
            .await
            .map_err(|e| sql_error("checking the pack", &e))?
            .get(0);
        if !installed {
            return Err("the source has no universe outbox: install the SQL pack there (server/sql/0*.sql, or start a gateway on it)".into());
        }
        Ok(Source { client })
    }

    /// The universe's id on targets (`kizuna.universe_identity()`).
    pub async fn identity(&self) -> Result<Uuid, String> {
        self.one("select kizuna.universe_identity()", &[]).await
    }

    /// Up to `n` pending events after `after`, in id order.
    pub async fn window(&self, after: i64, n: i64) -> Result<Vec<EventState>, String> {
        let rows = self
            .client
            .query("select * from kizuna.universe_window($1::bigint, ($2::bigint)::int)", &[&after, &n])
            .await
            .map_err(|e| sql_error("kizuna.universe_window", &e))?;
        Ok(rows
            .iter()
            .map(|r| EventState {
                id: r.get("id"),
                key: r.get("key"),
                delete: r.get("is_delete"),
                apply_after: r.get("apply_after_ms"),
                attempts: r.get::<_, i32>("attempts").max(0) as u32,
                max_attempts: r.get::<_, i32>("max_attempts").max(1) as u32,
                retry_at: r.get("retry_at_ms"),
                error: r.get("error"),
            })
            .collect())
    }

    /// The wire mutations of the events `ids` that are still pending, as JSON text exactly as the
    /// pack wrote it, and the ids it holds.
    /// Fresh ids and keys for the events of `ids` the target answered DELAYED before
    /// (`kizuna.universe_claim`): (old id, new id, new key).
    pub async fn claim(&self, ids: &[i64]) -> Result<Vec<(i64, i64, uuid::Uuid)>, String> {
        let rows = self
            .client
            .query("select old_id, new_id, new_key from kizuna.universe_claim($1)", &[&ids])
            .await
            .map_err(|e| sql_error("kizuna.universe_claim", &e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    pub async fn mutations(&self, ids: &[i64]) -> Result<(Vec<i64>, String), String> {
        let row = self
            .client
            .query_one("select sent, mutations from kizuna.universe_mutations($1)", &[&ids])
            .await
            .map_err(|e| sql_error("kizuna.universe_mutations", &e))?;
        Ok((row.get(0), row.get(1)))
    }

    /// Writes what delivery decided, in one transaction (`kizuna.universe_record`).
    pub async fn record(&self, updates: &[Update]) -> Result<Value, String> {
        let updates: Vec<Value> = updates
            .iter()
            .map(|u| match u {
                Update::Acknowledged { id, skipped } => {
                    json!({"id": id, "ack": if *skipped { "SKIPPED" } else { "APPLIED" }})
                }
                Update::Pending { id, attempts, retry_at, error } => {
                    json!({"id": id, "attempts": attempts, "retry_at_ms": retry_at, "error": error})
                }
                Update::DeadLetter { id, attempts, error } => {
                    json!({"id": id, "dead": true, "attempts": attempts, "error": error})
                }
            })
            .collect();
        self.one("select kizuna.universe_record($1)", &[&Value::Array(updates)]).await
    }

    /// Removes acknowledged events; returns how many.
    pub async fn prune_acked(&self) -> Result<i64, String> {
        self.one("select kizuna.universe_prune_acked()", &[]).await
    }

    /// `kizuna.universe_status()`.
    pub async fn status(&self) -> Result<Value, String> {
        self.one("select kizuna.universe_status()", &[]).await
    }

    /// The dead letters `ids` (all when `None`).
    pub async fn dead_letters(&self, ids: Option<&[i64]>) -> Result<Value, String> {
        self.one("select kizuna.universe_dead_letters($1)", &[&ids]).await
    }

    /// Requeues the dead letters `ids` (all when `None`); returns how many.
    pub async fn requeue(&self, ids: Option<&[i64]>) -> Result<i32, String> {
        self.one("select kizuna.universe_requeue($1)", &[&ids]).await
    }

    /// Discards the dead letters `ids` (all when `None`); returns how many.
    pub async fn discard(&self, ids: Option<&[i64]>) -> Result<i32, String> {
        self.one("select kizuna.universe_discard($1)", &[&ids]).await
    }

    async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<T, String> {
        let row = self.client.query_one(sql, params).await.map_err(|e| sql_error(sql, &e))?;
        row.try_get(0).map_err(|e| sql_error(sql, &e))
    }
}

fn sql_error(what: &str, e: &tokio_postgres::Error) -> String {
    format!("source: {what} failed: {}", db::describe(e))
}
