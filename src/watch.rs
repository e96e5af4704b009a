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
use crate::ordering::{self, OrderBy};
use crate::runner::Inner;
use crate::values;

/// Above this many touched keys of one table a watch rescans through the index: one `getAll` is
/// cheaper than that many single reads.
const RESCAN_ABOVE: usize = 256;

/// `where` (columns that must equal these values), `bucket` (rows the server placed in it, and
/// rows written here that no pull has placed yet), `orderBy` and `limit` (`ordering.rs`).
#[derive(Clone, Default)]
pub struct Filter {
    pub conditions: Row,
    pub bucket: Option<String>,
    pub order_by: Option<OrderBy>,
    pub limit: Option<usize>,
}

impl Filter {
    /// Parses `{ where?, bucket?, orderBy?, limit? }`; any other key is refused, so a misspelt one
    /// fails loudly.
    pub fn parse(filter: Option<JsValue>) -> Result<Filter, JsValue> {
        let Some(filter) = values::options(&filter.unwrap_or(JsValue::UNDEFINED), "filter")? else { return Ok(Filter::default()) };
        if let Some(key) = values::unknown_key(&filter, &"filter", &["where", "bucket", "orderBy", "limit"])? {
            return Err(invalid(format!("unknown filter key '{key}'; known: where, bucket, orderBy, limit")));
        }
        let w = values::property(&filter, "where", &"filter")?;
        let conditions = if w.is_undefined() { Row::new() } else { values::row(&w, "filter.where")? };
        // A row leaves an undefined column out, as JSON.stringify does; a condition left out would
        // match every row (`{ owner: user?.id }` with no user), so it is refused.
        if w.is_object() {
            for name in values::property_names(&w, &"filter.where")? {
                if values::property(&w, &name, &"filter.where")?.is_undefined() {
                    return Err(invalid(format!("filter.where.{name} is undefined: a condition needs a value (null finds null)")));
                }
            }
        }
        let b = values::property(&filter, "bucket", &"filter")?;
        let bucket = if b.is_undefined() { None } else { Some(values::text(&b, "filter.bucket")?) };
        let o = values::property(&filter, "orderBy", &"filter")?;
        let order_by = if o.is_undefined() { None } else { Some(OrderBy::parse(&o)?) };
        let l = values::property(&filter, "limit", &"filter")?;
        let limit = if l.is_undefined() { None } else { Some(ordering::parse_limit(&l)?) };
        Ok(Filter { conditions, bucket, order_by, limit })
    }

    /// The visible row of `record` when it belongs in the result. `unplaced_here` says whether a
    /// record without a bucket was written on this device (it counts for every bucket then: read
    /// your writes).
    fn admit(&self, record: &RowRecord, unplaced_here: impl FnOnce() -> bool) -> Option<Row> {
        let row = record.visible.as_ref()?;
        if !self.conditions.iter().all(|(k, v)| row.get(k).is_some_and(|got| kizuna_protocol::same_as_js(got, v))) {
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

    /// The whole result for `table`, by primary key, as JS rows straight from IndexedDB (see
    /// `Store::records_where`), through a declared equality index, the bucket's or the table's.
    /// Conditions are compared in JS: a string, number, boolean or null with `===`, anything else
    /// as JSON (`kizuna_protocol::same_as_js`).
    pub async fn select(&self, inner: &Inner, table: &str, mut each: impl FnMut(JsValue, JsValue)) -> Result<(), ClientError> {
        let conditions = Conditions::new(&self.conditions);
        let (table_js, pk_js) = (JsValue::from_str(table), JsValue::from_str("pk"));
        let bucket_js = self.bucket.as_deref().map(JsValue::from_str);
        // Rows written here have no bucket until a pull places them: they count for every bucket
        // (read your writes), in primary-key order among the others.
        let mut unplaced: Vec<(String, JsValue, JsValue)> = Vec::new();
        if self.bucket.is_some() {
            let keys: Vec<RowKey> = inner.engine.borrow().tracked_keys().into_iter().filter(|k| k.table == table).collect();
            for record in inner.store.records(&keys).await? {
                let bucket = field(&record, "bucket");
                if bucket.is_null() || bucket.is_undefined() {
                    if let Some(row) = conditions.admit(&record) {
                        let pk = field(&record, "pk");
                        unplaced.push((pk.as_string().unwrap_or_default(), pk, row));
                    }
                }
            }
            kizuna_engine::order::sort_by(&mut unplaced, |a, b| b.0.cmp(&a.0)); // popped from the end, smallest first
        }
        let mut visit = |record: &JsValue| {
            if bucket_js.is_some() && field(record, "table") != table_js {
                return;
            }
            let Some(row) = conditions.admit(record) else { return };
            let pk = Reflect::get(record, &pk_js).unwrap_or(JsValue::UNDEFINED);
            if !unplaced.is_empty() {
                let here = pk.as_string().unwrap_or_default();
                while unplaced.last().is_some_and(|(p, _, _)| *p < here) {
                    let (_, pk, row) = unplaced.pop().expect("checked");
                    each(pk, row);
                }
            }
            each(pk, row);
        };
        match &bucket_js {
            Some(b) => inner.store.records_where("bucket", &b.as_string().unwrap_or_default(), &mut visit).await?,
            None => inner.store.table_records(table, &self.conditions, &mut visit).await?,
        }
        while let Some((_, pk, row)) = unplaced.pop() {
            each(pk, row);
        }
        Ok(())
    }

    /// The result for the app: an array of its rows, in primary-key order or `orderBy`'s, at most
    /// `limit` of them.
    pub async fn rows(&self, inner: &Inner, table: &str) -> Result<js_sys::Array, ClientError> {
        let limit = self.limit.unwrap_or(usize::MAX);
        // Rows go from IndexedDB to the app without a copy in wasm memory (`select`); in an order,
        // each row's value of the column is held while they are sorted (`FirstRows`).
        match &self.order_by {
            None => {
                let (rows, mut taken) = (js_sys::Array::new(), 0);
                self.select(inner, table, |_, row| {
                    if taken < limit {
                        rows.push(&row);
                        taken += 1;
                    }
                })
                .await?;
                Ok(rows)
            }
            Some(order_by) => {
                let mut first = order_by.first_rows(limit);
                self.select(inner, table, |_, row| first.offer(row)).await?;
                Ok(first.into_array())
            }
        }
    }

    /// Whether the app sees only part of a result: a change to the rest alters the result and not
    /// what the app sees. (An order alone shows all of it: it changes exactly when the result does.)
    fn limits(&self) -> bool {
        self.limit.is_some()
    }

    /// What the app sees of a result held by primary key: in `orderBy`'s order, at most `limit` rows.
    fn shown<'r>(&self, result: &'r BTreeMap<String, Row>) -> Vec<&'r Row> {
        let mut rows = match &self.order_by {
            Some(order_by) => order_by.sort_rows(result.values()),
            None => result.values().collect(),
        };
        rows.truncate(self.limit.unwrap_or(usize::MAX));
        rows
    }

    /// The whole result for `table`, by primary key (a watch keeps it to tell what changed).
    pub async fn evaluate(&self, inner: &Inner, table: &str) -> Result<BTreeMap<String, Row>, ClientError> {
        let mut result = BTreeMap::new();
        let mut failure = None;
        self.select(inner, table, |pk, row| match crate::js::decode::<Row>(&row) {
            Ok(row) => {
                result.insert(pk.as_string().unwrap_or_default(), row);
            }
            Err(e) => failure = Some(ClientError::new("STORAGE_CORRUPT", e)),
        })
        .await?;
        failure.map_or(Ok(result), Err)
    }
}

/// The row the app sees in a stored `record`, as the browser read it: its `visible`, or its `base`
/// when the record leaves `visible` out; `None` for a row deleted here.
pub(crate) fn visible_row(record: &JsValue) -> Option<JsValue> {
    let has_visible = Reflect::has(record, &JsValue::from_str("visible")).unwrap_or(false);
    let row = field(record, if has_visible { "visible" } else { "base" });
    (!row.is_null() && !row.is_undefined()).then_some(row)
}

fn field(record: &JsValue, name: &str) -> JsValue {
    Reflect::get(record, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

/// A filter's `where`, ready to test JS rows.
struct Conditions {
    /// Column, and the value: a scalar as a JS value (`===`), anything else as JSON.
    tests: Vec<(JsValue, Result<JsValue, Value>)>,
}

impl Conditions {
    fn new(conditions: &Row) -> Conditions {
        let tests = conditions
            .iter()
            .map(|(column, value)| {
                let test = match value {
                    Value::Object(_) | Value::Array(_) => Err(value.clone()),
                    scalar => Ok(crate::js::encode(scalar).unwrap_or(JsValue::NULL)),
                };
                (JsValue::from_str(column), test)
            })
            .collect();
        Conditions { tests }
    }

    /// The row the app sees in a stored `record`, when it meets every condition.
    fn admit(&self, record: &JsValue) -> Option<JsValue> {
        let row = visible_row(record)?;
        let meets = self.tests.iter().all(|(column, test)| {
            let got = Reflect::get(&row, column).unwrap_or(JsValue::UNDEFINED);
            match test {
                Ok(scalar) => !got.is_undefined() && got == *scalar,
                Err(json) => crate::js::decode::<Value>(&got).is_ok_and(|v| kizuna_protocol::same_as_js(&v, json)),
            }
        });
        meets.then_some(row)
    }
}

struct Watch {
    id: u32,
    table: String,
    filter: Filter,
    listener: Function,
    /// Every row the filter admits, by primary key.
    result: RefCell<BTreeMap<String, Row>>,
    /// What the listener last heard, for a filter with a limit (`Filter::limits`): a change to a
    /// row past the limit alters the result but not what the app sees.
    shown: RefCell<Vec<Row>>,
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
    /// The keys of each table that changed; `None` for a table to re-read whole.
    Keys(BTreeMap<String, Option<BTreeSet<String>>>),
    Everything,
}

fn touched(events: &[Event]) -> Touched {
    let mut keys: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    for event in events {
        match event {
            Event::Rehydrated { .. } => return Touched::Everything,
            Event::Change { keys: changed, tables, .. } => {
                for k in changed {
                    if let Some(pks) = keys.entry(k.table.clone()).or_insert_with(|| Some(BTreeSet::new())) {
                        pks.insert(k.pk.clone());
                    }
                }
                for table in tables {
                    keys.insert(table.clone(), None);
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
    let watch = Rc::new(Watch { id, table, filter, listener, result: RefCell::new(BTreeMap::new()), shown: RefCell::new(Vec::new()) });
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
                        refresh(&inner, &watch, pks.as_ref(), false).await;
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
    // The result is brought up to date where it is kept, key by key: cloning it to compare the
    // copy with the old cost a deep copy of every row at each change.
    let changed = match pks {
        Some(pks) if pks.len() <= RESCAN_ABOVE => {
            let keys: Vec<RowKey> = pks.iter().map(|pk| RowKey::new(watch.table.clone(), pk.clone())).collect();
            let records = match inner.store.rows(&keys).await {
                Ok(r) => r,
                Err(e) => return report(&e),
            };
            let engine = inner.engine.borrow();
            let mut result = watch.result.borrow_mut();
            let mut changed = false;
            for key in &keys {
                let admitted = records.get(key).and_then(|record| {
                    watch.filter.admit(record, || engine.is_tracked(key))
                });
                changed |= match admitted {
                    Some(row) if result.get(&key.pk) == Some(&row) => false,
                    Some(row) => {
                        result.insert(key.pk.clone(), row);
                        true
                    }
                    None => result.remove(&key.pk).is_some(),
                };
            }
            changed
        }
        _ => {
            let next = match watch.filter.evaluate(inner, &watch.table).await {
                Ok(r) => r,
                Err(e) => return report(&e),
            };
            let mut result = watch.result.borrow_mut();
            let changed = *result != next;
            *result = next;
            changed
        }
    };
    if !first && !changed {
        return;
    }
    let result = watch.result.borrow();
    let shown = watch.filter.shown(&result);
    if watch.filter.limits() {
        if !first && watch.shown.borrow().iter().eq(shown.iter().copied()) {
            return;
        }
        *watch.shown.borrow_mut() = shown.iter().map(|row| (*row).clone()).collect();
    }
    let encoded = crate::js::encode(&shown);
    drop(result);
    let Ok(js) = encoded else { return };
    if let Err(err) = watch.listener.call1(&JsValue::NULL, &js) {
        web_sys::console::error_2(&"kizuna: a watch listener threw".into(), &err);
    }
}

fn report(e: &ClientError) {
    web_sys::console::error_1(&format!("kizuna: a live query could not read the store: {}: {}", e.code, e.message).into());
}
