//! The checks of a history, from the devices' records (record.rs), the plain-SQL writer's log and
//! the server's rows:
//! - every read (each commit is one) shows the server's state at the checkpoint it read on, as the
//!   user's policies and buckets render it, with the device's own writes that were acknowledged
//!   above that checkpoint folded in, refusals' rows in place, and the pending writes replayed on
//!   top: read-your-writes, and never half a checkpoint;
//! - the read position never regresses (record.rs, at each commit);
//! - writes apply in issue order, and after the read watermark they were made on (record.rs);
//! - every write ends applied, refused with its event, coalesced, or dead-lettered with its event;
//! - exactly-once effect: the server's rows, with `n` (the writes each took), are the applied
//!   writes replayed once each;
//! - convergence: each device's last read shows the server's rows for its user and buckets.

use std::collections::{BTreeMap, BTreeSet};

use kizuna_engine::protocol::Row;
use kizuna_engine::util::{apply_op, replay};
use kizuna_engine::OutboxEntry;
use kizuna_protocol::same_as_js as same;
use serde_json::Value;
use tokio_postgres::Client as Pg;

use crate::model::{Effect, Model};
use crate::plan::TABLES;
use crate::record::{row_name, Heard, Outcome, Read, Record};

pub async fn check(records: &[&Record], sql: &[Effect], pg: &Pg, tag: &str) -> Result<Vec<String>, String> {
    let mut violations: Vec<String> = Vec::new();
    let mut model = Model::default();
    for effect in sql {
        model.add(effect.clone());
    }
    for rec in records {
        violations.extend(rec.violations.iter().cloned());
        for (id, entry) in &rec.writes {
            let outcome = rec.outcomes.get(id);
            if outcome.is_none() {
                if let Some(status) = ledger_status(pg, id).await? {
                    violations.push(format!(
                        "{}: write {} ({}) is {status} in the server's ledger, but no page told it",
                        rec.name, entry.seq, entry.pk
                    ));
                    continue;
                }
            }
            match outcome {
                Some(Outcome::Applied(Some(seq))) => model.add(Effect {
                    seq: *seq,
                    order: entry.seq,
                    user: rec.user.clone(),
                    table: entry.table.clone(),
                    pk: entry.pk.clone(),
                    hlc: Some(entry.hlc.clone()),
                    sql: false,
                    op: entry.op,
                    columns: entry.columns.clone(),
                }),
                Some(Outcome::Applied(None)) => {
                    violations.push(format!("{}: write {} was SKIPPED with no ledger pruning in this history", rec.name, entry.seq))
                }
                Some(_) => {}
                None => violations.push(format!("{}: write {} ({}) ended with no verdict, event or dead letter", rec.name, entry.seq, entry.pk)),
            }
        }
    }

    for rec in records {
        for read in &rec.reads {
            violations.extend(check_read(&model, rec, read, tag));
        }
        // Monotonic writes: applied in issue order. A write with a delay window is the documented
        // exception: it is held without holding the writes behind it.
        let mut applied: Vec<(i64, i64)> = rec
            .writes
            .values()
            .filter(|e| e.apply_after.is_none())
            .filter_map(|e| match rec.outcomes.get(&e.id) {
                Some(Outcome::Applied(Some(seq))) => Some((e.seq, *seq)),
                _ => None,
            })
            .collect();
        applied.sort();
        if applied.windows(2).any(|w| w[0].1 > w[1].1) {
            violations.push(format!("{}: writes applied out of issue order: {applied:?}", rec.name));
        }
    }

    // Exactly-once effect: the server's rows (with `n`, the writes each took) are the model's.
    let mut server: BTreeMap<String, Value> = BTreeMap::new();
    for table in TABLES {
        let rows = pg
            .query(&format!("select id, to_jsonb(t) from public.{table} t where id like $1"), &[&format!("{tag}-%")])
            .await
            .map_err(|e| e.to_string())?;
        for r in rows {
            server.insert(row_name(table, &r.get::<_, String>(0)), r.get::<_, Value>(1));
        }
    }
    let modelled = model.rows_at(i64::MAX);
    if !same_rows(&server, &modelled) {
        violations.push(format!("the server's rows are not the applied writes, each once: {}", difference(&server, &modelled)));
    }

    // Convergence: each device's last read, after quiescence, shows the server's rows as its user
    // and buckets render them.
    for rec in records {
        let Some(last) = rec.reads.last() else { continue };
        let want = model.view_at(i64::MAX, &rec.user, &last.buckets);
        let got = mine(&last.rows, tag);
        if !same_rows(&got, &want) || !last.pending.is_empty() {
            violations.push(format!("{}: did not converge: {} (pending {})", rec.name, difference(&got, &want), last.pending.len()));
        }
    }
    // One line for each thing found, however many reads found it.
    let mut seen = BTreeSet::new();
    violations.retain(|v| seen.insert(v.clone()));
    Ok(violations)
}

/// A write no page told the outcome of: what the server's ledger says became of it, if anything.
/// Every outcome must be told (the client keeps a step's events until they are), so any answer
/// here is a write whose fate the app never learnt.
async fn ledger_status(pg: &Pg, id: &uuid::Uuid) -> Result<Option<String>, String> {
    let row = pg
        .query_opt("select verdict ->> 'status' from kizuna.ledger where id = ($1::text)::uuid", &[&id.to_string()])
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
}

/// The rows of this history.
fn mine(rows: &BTreeMap<String, Value>, tag: &str) -> BTreeMap<String, Value> {
    rows.iter().filter(|(k, _)| k.split_once('/').is_some_and(|(_, pk)| pk.starts_with(tag))).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A row image as the device keeps it: gone when its list is not a bucket the device pulls.
fn in_buckets(row: Option<Row>, buckets: &[String]) -> Option<Row> {
    row.filter(|r| r.get("list").and_then(Value::as_str).is_some_and(|l| buckets.iter().any(|b| b == &format!("hl:{l}"))))
}

/// One read against the model: each row must be what the device may show given what it had heard.
/// The server's part of a row (its base) starts as the model's state at the read's checkpoint;
/// each of the device's own writes acknowledged above that checkpoint is folded in as the verdict
/// arrived; a refusal heard since the checkpoint's commit puts the server's row in place (a replayed
/// refusal leaves the base as it was, so either is allowed). The pending writes replayed over the
/// base must give exactly what the device showed.
fn check_read(model: &Model, rec: &Record, read: &Read, tag: &str) -> Vec<String> {
    let view = model.view_at(read.horizon, &rec.user, &read.checkpoint_buckets);
    let mut bases: BTreeMap<String, Vec<Option<Row>>> =
        view.into_iter().map(|(k, v)| (k, vec![v.as_object().cloned()])).collect();
    let mut heard: Vec<&(crate::record::At, Heard)> = rec.heard.iter().filter(|(at, _)| *at < read.at).collect();
    heard.sort_by_key(|(at, _)| *at);
    // None before the device's first commit: then every refusal heard counts (as `0` it left out
    // the first thing a device heard, a refusal's server row before any pull: seed 855 of a soak).
    let commit_at = heard.iter().rposition(|(_, h)| matches!(h, Heard::Committed { .. }));
    for (i, (_, h)) in heard.iter().enumerate() {
        match h {
            Heard::Applied { id, seq: Some(seq), bucket, buckets } if *seq > read.horizon => {
                // Folded into the row the device has, even a patch of a row it never pulled (the
                // app's own columns, until a pull brings the rest); gone where the server placed the
                // row outside the device's buckets.
                // Decided under one of several bucket sets (a page telling what the page before
                // it kept), the row may be folded in or gone.
                let Some(entry) = rec.writes.get(id) else { continue };
                let outside = |set: &Vec<String>| bucket.as_ref().is_some_and(|b| !set.contains(b));
                let (gone, kept) = (buckets.iter().any(outside), buckets.iter().any(|set| !outside(set)));
                let options = bases.entry(row_name(&entry.table, &entry.pk)).or_insert_with(|| vec![None]);
                let mut next: Vec<Option<Row>> = Vec::new();
                if kept {
                    next.extend(options.iter().map(|base| apply_op(base.clone(), entry.op, entry.columns.as_ref())));
                }
                if gone {
                    next.push(None);
                }
                *options = next;
            }
            Heard::Rejected { table, pk, server_row, buckets } if commit_at.is_none_or(|c| i > c) => {
                let options = bases.entry(row_name(table, pk)).or_insert_with(|| vec![None]);
                options.extend(buckets.iter().map(|set| in_buckets(server_row.clone(), set)));
            }
            _ => {}
        }
    }
    let mut pending: BTreeMap<String, Vec<&OutboxEntry>> = BTreeMap::new();
    for entry in &read.pending {
        pending.entry(row_name(&entry.table, &entry.pk)).or_default().push(entry);
    }
    let shown = mine(&read.rows, tag);
    let keys: BTreeSet<&String> = bases.keys().chain(pending.keys()).chain(shown.keys()).filter(|k| k.contains(tag)).collect();
    let mut violations = Vec::new();
    for key in keys {
        let writes = pending.get(key).cloned().unwrap_or_default();
        let none = vec![None];
        let options: Vec<Option<Value>> = bases
            .get(key)
            .unwrap_or(&none)
            .iter()
            .map(|base| replay(base.as_ref(), writes.iter().copied()).map(Value::Object))
            .collect();
        let got = shown.get(key).cloned();
        if !options.iter().any(|o| match (o, &got) {
            (Some(a), Some(b)) => same(a, b),
            (a, b) => a == b,
        }) {
            let want: Vec<String> = options.iter().map(|o| o.as_ref().map_or("nothing".into(), Value::to_string)).collect();
            violations.push(format!(
                "{}: a read on checkpoint {} shows {key} as {}, where it may show only {} ({} pending)",
                rec.name,
                read.horizon,
                got.map_or("nothing".into(), |v| v.to_string()),
                want.join(" or "),
                writes.len()
            ));
        }
    }
    violations
}

pub fn difference(got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) -> String {
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("missing {k}={v}")),
            Some(g) if !same(g, v) => out.push(format!("{k}: has {g}, should be {v}")),
            _ => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!("extra {k}={}", got[k]));
    }
    out.join("; ")
}

/// The part of the history that concerns the keys the violations name: every write, verdict,
/// pulled entry and plain-SQL write of those keys, and every reload, in time order.
pub fn trace_of(records: &[&Record], sql: &[Effect], violations: &[String], tag: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for v in violations {
        for word in v.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_' || c == '/')) {
            let pk = word.split_once('/').map_or(word, |(_, pk)| pk);
            if pk.starts_with(tag) && (pk.contains("-k") || pk.contains("-bulk")) && !keys.iter().any(|k| k == pk) {
                keys.push(pk.to_owned());
            }
        }
    }
    let mut lines: Vec<(i64, String)> = records
        .iter()
        .flat_map(|r| r.trace.iter())
        .filter(|(_, line)| line.contains("reload") || keys.iter().any(|k| line.split_whitespace().any(|w| w == k)))
        .cloned()
        .collect();
    lines.sort();
    let mut out: Vec<String> = lines.into_iter().map(|(t, line)| format!("{t} {line}")).collect();
    for e in sql.iter().filter(|e| keys.contains(&e.pk)) {
        out.push(format!("sql write {} {:?} at seq {}", e.pk, e.columns, e.seq));
    }
    out
}

/// `same` (numbers as the doubles an app reads) for every row of two sets of rows.
fn same_rows(a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>) -> bool {
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
}
