//! What the server's state was at any horizon, rebuilt from the history: every applied mutation
//! with its commit number (from the verdicts) and every plain-SQL write with its own (drawn inside
//! its transaction), replayed in commit order with the pack's rules for the checker's table
//! (arrival order: an upsert inserts or assigns the columns it names, a patch assigns, a delete
//! removes; `n` counts the writes a row took), then rendered as a user's policies and buckets do.

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
    pub pk: String,
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

    /// Every row at `horizon` (`i64::MAX`: now), unfiltered.
    pub fn rows_at(&self, horizon: i64) -> BTreeMap<String, Value> {
        let mut effects: Vec<&Effect> = self.effects.iter().filter(|e| e.seq <= horizon).collect();
        effects.sort_by_key(|e| (e.seq, e.order));
        let mut rows: BTreeMap<String, Value> = BTreeMap::new();
        for e in effects {
            let named = e.columns.clone().unwrap_or_default();
            match (e.op, rows.get_mut(&e.pk)) {
                (Op::Delete, _) => {
                    rows.remove(&e.pk);
                }
                (Op::Upsert | Op::Patch, Some(row)) => {
                    let object = row.as_object_mut().expect("rows are objects");
                    for (column, value) in named {
                        object.insert(column, value);
                    }
                    let n = object["n"].as_i64().unwrap_or(0);
                    object.insert("n".into(), json!(n + 1));
                }
                (Op::Upsert, None) => {
                    let mut row = json!({"id": e.pk, "owner": e.user, "list": null, "shared": false,
                                         "a": null, "b": null, "title": null, "n": 1});
                    let object = row.as_object_mut().expect("object");
                    for (column, value) in named {
                        object.insert(column, value);
                    }
                    rows.insert(e.pk.clone(), row);
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
