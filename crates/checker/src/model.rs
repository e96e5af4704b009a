//! What the server's state was at any horizon, rebuilt from the history: every applied mutation
//! with its commit number (from the verdicts) and every plain-SQL write with its own (drawn inside
//! its transaction), replayed in commit order with the pack's rules for the checker's tables (an
//! upsert inserts or assigns the columns it names, a patch assigns, a delete removes; `n` counts the
//! writes a row took), then rendered as a user's policies and buckets do. In `hist_items` a named
//! column is always assigned (arrival order); in `hist_notes` (hlc mode) only when the write's
//! clock is above the clock of the column's last assignment, as the pack orders columns. A
//! plain-SQL write stamps what its row trigger can see it set: an INSERT's non-null columns, an
//! UPDATE's changed ones.

use std::collections::BTreeMap;

use kizuna_engine::protocol::{Op, Row};
use serde_json::{json, Value};

/// One write that took effect on the server.
#[derive(Debug, Clone)]
pub struct Effect {
    /// Commit number.
    pub seq: i64,
    /// Order inside the commit (a push's mutations go in issue order).
    pub order: i64,
    /// Who wrote it (the `owner` of a row it creates).
    pub user: String,
    pub table: String,
    pub pk: String,
    /// The write's origin clock (the engine's, or the one the SQL writer set).
    pub hlc: Option<String>,
    /// A plain-SQL write: it assigns what it changes whatever the clocks (and stamps its own).
    pub sql: bool,
    pub op: Op,
    pub columns: Option<Row>,
}

#[derive(Default)]
pub struct Model {
    effects: Vec<Effect>,
}

impl Model {
    pub fn add(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// Every row at `horizon` (`i64::MAX`: now), unfiltered, by `table/pk`.
    pub fn rows_at(&self, horizon: i64) -> BTreeMap<String, Value> {
        let mut effects: Vec<&Effect> = self.effects.iter().filter(|e| e.seq <= horizon).collect();
        effects.sort_by_key(|e| (e.seq, e.order));
        let mut rows: BTreeMap<String, Value> = BTreeMap::new();
        // hlc mode: the clock of each column's last assignment, kept across deletes as the pack keeps it.
        let mut clocks: BTreeMap<(String, String), String> = BTreeMap::new();
        for e in effects {
            let name = crate::record::row_name(&e.table, &e.pk);
            let hlc_mode = e.table == "hist_notes";
            let named = e.columns.clone().unwrap_or_default();
            match (e.op, rows.get_mut(&name)) {
                (Op::Delete, _) => {
                    rows.remove(&name);
                }
                (Op::Upsert | Op::Patch, Some(row)) => {
                    let object = row.as_object_mut().expect("rows are objects");
                    for (column, value) in named {
                        // A plain-SQL UPDATE assigns only what it changes: the pack's row trigger
                        // sees the row before and after, not the columns the statement named.
                        if e.sql && object.get(&column) == Some(&value) {
                            continue;
                        }
                        let clock = (name.clone(), column.clone());
                        let wins = match (hlc_mode && !e.sql, &e.hlc, clocks.get(&clock)) {
                            (true, Some(mine), Some(theirs)) => mine.as_str() > theirs.as_str(),
                            _ => true,
                        };
                        if wins {
                            object.insert(column, value);
                            if let Some(h) = &e.hlc {
                                clocks.insert(clock, h.clone());
                            }
                        }
                    }
                    let n = object["n"].as_i64().unwrap_or(0);
                    object.insert("n".into(), json!(n + 1));
                }
                (Op::Upsert, None) => {
                    let mut row = json!({"id": e.pk, "owner": e.user, "list": null, "shared": false,
                                         "a": null, "b": null, "x": null, "title": null, "n": 1});
                    let object = row.as_object_mut().expect("object");
                    for (column, value) in named {
                        // A plain-SQL INSERT stamps the columns it sets to a value, not its nulls.
                        if let Some(h) = e.hlc.as_ref().filter(|_| !(e.sql && value.is_null())) {
                            clocks.insert((name.clone(), column.clone()), h.clone());
                        }
                        object.insert(column, value);
                    }
                    rows.insert(name, row);
                }
                (Op::Patch, None) => {} // the pack refuses it (RLS_DENIED): no verdict APPLIED
            }
        }
        rows
    }

    /// The rows `user` may read in `buckets` at `horizon`: its own and the shared ones, in the
    /// buckets asked for (`'hl:' || list`).
    pub fn view_at(&self, horizon: i64, user: &str, buckets: &[String]) -> BTreeMap<String, Value> {
        self.rows_at(horizon)
            .into_iter()
            .filter(|(_, row)| row["owner"] == user || row["shared"] == true)
            .filter(|(_, row)| row["list"].as_str().is_some_and(|l| buckets.contains(&format!("hl:{l}"))))
            .collect()
    }
}
