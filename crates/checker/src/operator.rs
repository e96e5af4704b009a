//! What an operator does to the database in plain SQL while clients write: bulk transactions of
//! many rows and buckets, and migrations of a synced table. Both are where the pack's bugs hid that
//! the clients' own writes never met (a commit of thousands of deletes folded in quadratic time; a
//! key's type changed under the capture's cached plans), so the histories run them too.

use std::future::Future;
use std::time::Duration;

use kizuna_engine::protocol::{Op, Row};
use serde_json::json;
use tokio_postgres::Client as Pg;

use crate::model::Effect;
use crate::plan::TABLES;
use crate::record::now_ms;

/// Runs `attempt` (one transaction) until it commits: again after a deadlock or a serialization
/// failure (a concurrent push locked the rows in another order), as a careful operator's script
/// would, up to ten times; any other error, or a tenth failure, is the history's error (`what`).
async fn retried<T, F, Fut>(pg: &Pg, what: &str, mut attempt: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(e) => {
                let _ = pg.batch_execute("rollback").await;
                let transient = e.code().is_some_and(|c| matches!(c.code(), "40P01" | "40001"));
                if !transient || tries == 10 {
                    return Err(format!("{what}: {e}"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One transaction over both tables: `fill` new rows of `owner` in list `from` (named `pk_prefix`
/// and a number), then every row of `from` moved to `to`, or deleted. Returns each write's effect
/// at the transaction's commit number, in the order it made them, and the keys it created.
pub async fn bulk(pg: &Pg, pk_prefix: &str, owner: &str, from: &str, to: Option<&str>, fill: u64) -> Result<(Vec<Effect>, Vec<(&'static str, String)>), String> {
    retried(pg, "bulk SQL", || bulk_once(pg, pk_prefix, owner, from, to, fill)).await
}

async fn bulk_once(pg: &Pg, pk_prefix: &str, owner: &str, from: &str, to: Option<&str>, fill: u64) -> Result<(Vec<Effect>, Vec<(&'static str, String)>), tokio_postgres::Error> {
    // The clock the transaction stamps on the columns it writes (hlc mode), known to the history.
    let hlc = format!("{:013}-0000-bulk", now_ms());
    pg.batch_execute("begin").await?;
    pg.execute("select set_config('kizuna.hlc', $1, true)", &[&hlc]).await?;
    let mut writes: Vec<(&'static str, String, Op, Option<Row>)> = Vec::new();
    let mut created = Vec::new();
    for (t, table) in TABLES.iter().enumerate() {
        // Every column named: the pack stamps the non-null ones, and so does the model.
        let inserted = pg
            .query(
                &format!(
                    "insert into public.{table} (id, owner, list, shared, a, b, x, title) \
                     select $1::text || '-' || $2::bigint || '-' || g, $3::text::uuid, $4::text, false, null, null, null, 'bulk' \
                     from generate_series(1, $5::bigint) g returning id::text"
                ),
                &[&pk_prefix, &(t as i64), &owner, &from, &(fill as i64)],
            )
            .await?;
        for r in inserted {
            let pk: String = r.get(0);
            let columns = json!({"owner": owner, "list": from, "shared": false, "a": null, "b": null, "x": null, "title": "bulk"});
            writes.push((table, pk.clone(), Op::Upsert, columns.as_object().cloned()));
            created.push((*table, pk));
        }
    }
    for table in TABLES {
        let (rows, op, columns) = match to {
            Some(to) => {
                let sql = format!("update public.{table} set list = $2 where list = $1 returning id::text");
                (pg.query(&sql, &[&from, &to]).await?, Op::Patch, json!({"list": to}).as_object().cloned())
            }
            None => (pg.query(&format!("delete from public.{table} where list = $1 returning id::text"), &[&from]).await?, Op::Delete, None),
        };
        writes.extend(rows.iter().map(|r| (table, r.get(0), op, columns.clone())));
    }
    let seq: i64 = pg.query_one("select kizuna.fence_now()", &[]).await?.get(0);
    pg.batch_execute("commit").await?;
    let effects = writes
        .into_iter()
        .enumerate()
        .map(|(order, (table, pk, op, columns))| Effect {
            seq,
            order: order as i64,
            user: owner.to_owned(),
            table: table.into(),
            pk,
            hlc: Some(hlc.clone()),
            sql: true,
            op,
            columns,
        })
        .collect();
    Ok((effects, created))
}

/// A migration of `table` while clients write: its key and column `b` change type (text to
/// varchar, or back), a column with a default comes and goes, the key column is renamed and named
/// back (the pack's event trigger takes each step up, and announces every row again at the
/// migration's commit), and then, as an app's setup does at
/// its next start, the table is registered again. No row's value changes, so the history's model
/// is unchanged; the devices must show the same rows throughout.
pub async fn migrate(pg: &Pg, table: &str) -> Result<(), String> {
    let alter = format!(
        "do $$ begin
           if (select atttypid from pg_attribute where attrelid = 'public.{table}'::regclass and attname = 'id') = 'text'::regtype then
             alter table public.{table} alter column id type varchar, alter column b type varchar;
           else
             alter table public.{table} alter column id type text, alter column b type text;
           end if;
         end $$;
         alter table public.{table} add column migrated integer not null default 7;
         alter table public.{table} drop column migrated;
         alter table public.{table} rename column id to id_renamed;
         alter table public.{table} rename column id_renamed to id;"
    );
    let migration = format!("begin; {alter} commit;");
    retried(pg, &format!("migrating {table}"), || pg.batch_execute(&migration)).await?;
    // The app's next start comes a little later, while the writer writes.
    tokio::time::sleep(Duration::from_millis(30)).await;
    pg.execute("select public.hist_register($1::text::regclass)", &[&format!("public.{table}")])
        .await
        .map_err(|e| format!("registering {table} again: {e}"))?;
    Ok(())
}
