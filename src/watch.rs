//! Live queries: `watch(table, filter, listener)` and the filter `query` shares with it.
//!
//! A watch keeps its result by primary key. After each committed change (a local write in any tab,
//! a checkpoint, a verdict, a compensation) it reads back only the keys of its table that the
//! change names, and calls the listener when the result differs. A change naming more keys than
//! `RESCAN_ABOVE`, and a rehydration (which replaces every row), recompute the result through the
//! table's (or bucket's) index instead. Updates run one at a time, in commit order.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use futures_util::lock::Mutex;
use js_sys::{Function, Reflect};
use kizuna_engine::{Event, RowKey, RowRecord};
use kizuna_protocol::Row;
use serde_json::Value;
use wasm_bindgen::prelude::*;

use crate::api::invalid;
use crate::error::ClientError;
use crate::runner::Inner;
use crate::values;

/// Above this many touched keys of one table a watch rescans through the index: one `getAll` is
/// cheaper than that many single reads.
const RESCAN_ABOVE: usize = 256;

/// `where` (columns that must equal these values) and `bucket` (rows the server placed in it, and
/// rows written here that no pull has placed yet).
#[derive(Clone, Default)]
pub struct Filter {
    pub conditions: Row,
    pub bucket: Option<String>,
}

impl Filter {
    /// Parses `{ where?, bucket? }`; any other key is refused, so a misspelt one fails loudly.
    pub fn parse(filter: Option<JsValue>) -> Result<Filter, JsValue> {
        let Some(filter) = values::options(&filter.unwrap_or(JsValue::UNDEFINED), "filter")? else { return Ok(Filter::default()) };
        for key in js_sys::Object::keys(&filter).iter().filter_map(|k| k.as_string()) {
            if key != "where" && key != "bucket" {
                return Err(invalid(format!("unknown filter key '{key}'; known: where, bucket")));
            }
        }
        let w = Reflect::get(&filter, &"where".into()).unwrap_or_default();
        let conditions = if w.is_undefined() { Row::new() } else { values::row(&w, "filter.where")? };
        let b = Reflect::get(&filter, &"bucket".into()).unwrap_or_default();
        let bucket = if b.is_undefined() { None } else { Some(values::text(&b, "filter.bucket")?) };
        Ok(Filter { conditions, bucket })
    }

    /// The visible row of `record` when it belongs in the result. `unplaced_here` says whether a
    /// record without a bucket was written on this device (it counts for every bucket then: read
    /// your writes).
    fn admit(&self, record: &RowRecord, unplaced_here: impl FnOnce() -> bool) -> Option<Row> {
        let row = record.visible.as_ref()?;
        if !self.conditions.iter().all(|(k, v)| row.get(k) == Some(v)) {
            return None;
        }
        if let Some(bucket) = &self.bucket {
            let placed = match &record.bucket {
                Some(b) => b == bucket,
                None => unplaced_here(),
            };
            if !placed {
                return None;
            }
        }
        Some(row.clone())
    }

    /// The whole result for `table`, by primary key, through the bucket's or the table's index.
    pub async fn evaluate(&self, inner: &Inner, table: &str) -> Result<BTreeMap<String, Row>, ClientError> {
        let indexed = crate::indexes::lookup(inner.store.indexes(), table, &self.conditions);
        let mut records = match (&self.bucket, indexed) {
            (Some(b), _) => inner.store.rows_where("bucket", b).await?.into_iter().filter(|r| r.table == table).collect(),
            (None, Some(token)) => inner.store.rows_equal(&token).await?,
            (None, None) => inner.store.rows_where("table", table).await?,
        };
        if self.bucket.is_some() {
            // Rows written here have no bucket until a pull places them.
            let keys: Vec<RowKey> = inner.engine.borrow().tracked_keys().into_iter().filter(|k| k.table == table).collect();
            records.extend(inner.store.rows(&keys).await?.into_values().filter(|r| r.bucket.is_none()));
        }
        Ok(records.into_iter().filter_map(|r| self.admit(&r, || true).map(|row| (r.pk, row))).collect())
    }
}

struct Watch {
    id: u32,
    table: String,
    filter: Filter,
    listener: Function,
    result: RefCell<BTreeMap<String, Row>>,
}

#[derive(Default)]
pub struct Watches {
    next_id: Cell<u32>,
    list: RefCell<Vec<Rc<Watch>>>,
    /// One update at a time, so results follow commit order.
    turn: Mutex<()>,
}

impl Watches {
    pub fn clear(&self) {
        self.list.borrow_mut().clear();
    }
}

/// What a batch of committed events asks of the watches.
enum Touched {
    Nothing,
    Keys(BTreeMap<String, BTreeSet<String>>),
    Everything,
}

fn touched(events: &[Event]) -> Touched {
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for event in events {
        match event {
            Event::Rehydrated { .. } => return Touched::Everything,
            Event::Change { keys: changed, .. } => {
                for k in changed {
                    keys.entry(k.table.clone()).or_default().insert(k.pk.clone());
                }
            }
            _ => {}
        }
    }
    if keys.is_empty() { Touched::Nothing } else { Touched::Keys(keys) }
}

/// Starts a watch: the listener hears the current result soon, then every change to it.
/// Returns the watch's id for `unwatch`.
pub fn watch(inner: &Rc<Inner>, table: String, filter: Filter, listener: Function) -> u32 {
    let id = inner.watches.next_id.get() + 1;
    inner.watches.next_id.set(id);
    let watch = Rc::new(Watch { id, table, filter, listener, result: RefCell::new(BTreeMap::new()) });
    inner.watches.list.borrow_mut().push(watch.clone());
    let inner = inner.clone();
    wasm_bindgen_futures::spawn_local(async move {
        let _turn = inner.watches.turn.lock().await;
        if is_live(&inner, id) {
            refresh(&inner, &watch, None, true).await;
        }
    });
    id
}

pub fn unwatch(inner: &Inner, id: u32) {
    inner.watches.list.borrow_mut().retain(|w| w.id != id);
}

fn is_live(inner: &Inner, id: u32) -> bool {
    !inner.closed.get() && inner.watches.list.borrow().iter().any(|w| w.id == id)
}

/// Committed events reached this tab: bring every watch they concern up to date.
pub fn changed(inner: &Rc<Inner>, events: &[Event]) {
    if inner.watches.list.borrow().is_empty() {
        return;
    }
    let touched = touched(events);
    if matches!(touched, Touched::Nothing) {
        return;
    }
    let inner = inner.clone();
    wasm_bindgen_futures::spawn_local(async move {
        let _turn = inner.watches.turn.lock().await;
        let watches: Vec<Rc<Watch>> = inner.watches.list.borrow().clone();
        for watch in watches {
            if !is_live(&inner, watch.id) {
                continue;
            }
            match &touched {
                Touched::Everything => refresh(&inner, &watch, None, false).await,
                Touched::Keys(by_table) => {
                    if let Some(pks) = by_table.get(&watch.table) {
                        refresh(&inner, &watch, Some(pks), false).await;
                    }
                }
                Touched::Nothing => {}
            }
        }
    });
}

/// Recomputes a watch's result (only `pks` when given and few enough) and calls its listener when
/// the result changed, or always on the first call.
async fn refresh(inner: &Inner, watch: &Watch, pks: Option<&BTreeSet<String>>, first: bool) {
    let next = match pks {
        Some(pks) if pks.len() <= RESCAN_ABOVE => {
            let keys: Vec<RowKey> = pks.iter().map(|pk| RowKey::new(watch.table.clone(), pk.clone())).collect();
            let records = match inner.store.rows(&keys).await {
                Ok(r) => r,
                Err(e) => return report(&e),
            };
            let engine = inner.engine.borrow();
            let mut result = watch.result.borrow().clone();
            for key in &keys {
                let admitted = records.get(key).and_then(|record| {
                    watch.filter.admit(record, || engine.is_tracked(key))
                });
                match admitted {
                    Some(row) => result.insert(key.pk.clone(), row),
                    None => result.remove(&key.pk),
                };
            }
            result
        }
        _ => match watch.filter.evaluate(inner, &watch.table).await {
            Ok(r) => r,
            Err(e) => return report(&e),
        },
    };
    if !first && *watch.result.borrow() == next {
        return;
    }
    let rows = Value::Array(next.values().cloned().map(Value::Object).collect());
    *watch.result.borrow_mut() = next;
    let Ok(js) = crate::js::encode(&rows) else { return };
    if let Err(err) = watch.listener.call1(&JsValue::NULL, &js) {
        web_sys::console::error_2(&"kizuna: a watch listener threw".into(), &err);
    }
}

fn report(e: &ClientError) {
    web_sys::console::error_1(&format!("kizuna: a live query could not read the store: {}: {}", e.code, e.message).into());
}
