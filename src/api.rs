//! The JS face of the package: `KizunaClient.open(options)` and the methods on the client.
//! Every method validates its input and answers with a settled promise: a bad argument is an
//! `Error` with `code: "INVALID_ARGUMENT"` and stores nothing.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures_util::lock::Mutex;
use js_sys::{Function, Promise, Reflect};
use kizuna_engine::{Engine, LocalWrite, RowRecord};
use kizuna_protocol::{Op, Row};
use serde_json::{json, Value};
use uuid::Uuid;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::future_to_promise;

use crate::error::ClientError;
use crate::events::{Listeners, EVENT_NAMES};
use crate::js;
use crate::lock::DatabaseLock;
use crate::runner::{now, Inner};
use crate::scheduler::{self, Scheduler};
use crate::options::ClientOptions;
use crate::store::Store;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** A row: column name to JSON value. */
export type Row = Record<string, unknown>;

export interface ClientOptions {
  /** IndexedDB database name; one per user and app. */
  name: string;
  /** Base URL of the gateway or Supabase project, e.g. "http://127.0.0.1:8787". */
  url: string;
  /** Returns the current access token (JWT), a promise of one, or null when signed out. */
  token: () => string | null | Promise<string | null>;
  /** Buckets to pull, e.g. ["user:<uid>"]. */
  buckets: string[];
  /** Supabase anon key, sent as `apikey` when given. */
  apikey?: string;
  /** A fetch to use instead of globalThis.fetch (proxies, tests). */
  fetch?: typeof fetch;
  /** Run push and pull loops on timers (default true). When false, only sync() talks to the server. */
  autoSync?: boolean;
  /** Open the server's wake stream to pull soon after remote changes (default true with autoSync). */
  realtimeWakeups?: boolean;
  /** Scheduled pull interval in ms (default 30000). */
  pullIntervalMs?: number;
  /** Entries per pull page (default 1000). */
  pullLimit?: number;
  /** Mutations per push (default 64). */
  maxSlice?: number;
  /** First retry delay in ms, doubled per failure with jitter (default 1000). */
  retryBaseMs?: number;
  /** Largest retry delay in ms (default 60000). */
  retryMaxMs?: number;
  /** Per-request deadline in ms (default 30000). */
  requestTimeoutMs?: number;
  /** Tables whose pending writes coalesce: only the newest unsent write per key is kept. */
  latestOnlyTables?: string[];
}

export interface WriteOptions {
  /** Hold the write until this time (Date or ms since epoch); the server answers DELAYED before it. */
  applyAfter?: Date | number;
  /** Override the table's latest-only setting for this write. */
  latestOnly?: boolean;
}

export type BatchWrite =
  | { op: "upsert"; table: string; pk: string; row: Row }
  | { op: "patch"; table: string; pk: string; columns: Row }
  | { op: "delete"; table: string; pk: string };

export interface Checkpoint { cursor: string | null; horizon: number; committedAt: number | null; }
export interface SyncHealth { failureStreak: number; lastError: string | null; lastSuccessAt: number | null; inFlight: boolean; online: boolean; }
export interface SyncStatus { pending: number; retrying: number; deadLetters: number; applied: number; rejected: number; skipped: number; delayed: number; }
export interface SyncReport { pushes: number; pulled: boolean; pushError: { code: string; message: string; status: number | null } | null; }
export type KizunaEventName = "change" | "applied" | "rejected" | "deadLetter" | "pushFailed" | "pullFailed" | "pullProgress"
  | "checkpoint" | "conflicts" | "checkpointExpired" | "serverReset" | "rehydrated";
"#;

/// An offline-first client over one IndexedDB database.
#[wasm_bindgen]
pub struct KizunaClient {
    inner: Rc<Inner>,
    scheduler: Rc<Scheduler>,
    lock: RefCell<DatabaseLock>,
}

pub(crate) fn invalid(message: impl Into<String>) -> JsValue {
    ClientError::invalid(message).into()
}

fn to_js<T: serde::Serialize + ?Sized>(value: &T) -> JsValue {
    js::encode(value).unwrap_or(JsValue::NULL)
}

/// Reads an object of columns from JS; anything but a plain object is refused.
fn row_from_js(value: JsValue, what: &str) -> Result<Row, JsValue> {
    if !value.is_object() || js_sys::Array::is_array(&value) {
        return Err(invalid(format!("{what} must be an object of columns")));
    }
    match serde_wasm_bindgen::from_value::<Value>(value) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid(format!("{what} must be an object of columns"))),
        Err(e) => Err(invalid(format!("{what} is not JSON-representable: {e}"))),
    }
}

fn write_options(options: JsValue) -> Result<(Option<i64>, Option<bool>), JsValue> {
    if options.is_undefined() || options.is_null() {
        return Ok((None, None));
    }
    let after = Reflect::get(&options, &"applyAfter".into()).unwrap_or(JsValue::UNDEFINED);
    let apply_after = if after.is_undefined() || after.is_null() {
        None
    } else if let Some(date) = after.dyn_ref::<js_sys::Date>() {
        Some(date.get_time() as i64)
    } else if let Some(ms) = after.as_f64().filter(|v| v.is_finite()) {
        Some(ms as i64)
    } else {
        return Err(invalid("options.applyAfter must be a Date or a number of ms since the epoch"));
    };
    let latest = Reflect::get(&options, &"latestOnly".into()).unwrap_or(JsValue::UNDEFINED);
    let latest_only = if latest.is_undefined() { None } else { Some(latest.as_bool().ok_or_else(|| invalid("options.latestOnly must be a boolean"))?) };
    Ok((apply_after, latest_only))
}

fn single_write(table: String, pk: String, op: Op, columns: Option<Row>, options: JsValue) -> Result<LocalWrite, JsValue> {
    let (apply_after, latest_only) = write_options(options)?;
    Ok(LocalWrite { table, pk, op, columns, apply_after, latest_only })
}

fn random_seed() -> u64 {
    let hi = (js_sys::Math::random() * 4_294_967_296.0) as u64;
    let lo = (js_sys::Math::random() * 4_294_967_296.0) as u64;
    (hi << 32) ^ lo ^ (now() as u64)
}

fn random_uuid() -> Uuid {
    let crypto = Reflect::get(&js_sys::global(), &"crypto".into()).ok();
    let made = crypto
        .and_then(|c| Reflect::get(&c, &"randomUUID".into()).ok().and_then(|f| f.dyn_into::<Function>().ok()).map(|f| (c, f)))
        .and_then(|(c, f)| f.call0(&c).ok())
        .and_then(|v| v.as_string())
        .and_then(|s| Uuid::parse_str(&s).ok());
    made.unwrap_or_else(|| Uuid::from_u64_pair(random_seed(), random_seed()))
}

fn rows_to_js(records: Vec<RowRecord>) -> JsValue {
    to_js(&Value::Array(records.into_iter().filter_map(|r| r.visible.map(Value::Object)).collect()))
}

impl KizunaClient {
    /// `open` for Rust callers (the browser tests drive the same code path JS does).
    pub async fn connect(options: JsValue) -> Result<KizunaClient, JsValue> {
        let ClientOptions { name, config, transport, auto_sync, realtime_wakeups } = ClientOptions::parse(&options)?;
        let lock = DatabaseLock::acquire(&name).await?;
        let store = Store::open(&name).await?;
        let state = match store.load().await? {
            Some(state) => state,
            None => Engine::fresh_state(random_uuid()),
        };
        let seed = random_seed();
        let engine = Engine::new(config.clone(), state, seed);
        let checkpoint = engine.checkpoint().clone();
        let inner = Rc::new(Inner {
            store,
            engine: RefCell::new(engine),
            config,
            transport,
            listeners: Rc::new(RefCell::new(Listeners::default())),
            activity: Mutex::new(()),
            closed: Cell::new(false),
            seed: Cell::new(seed),
            checkpoint: RefCell::new(checkpoint),
        });
        let scheduler = Rc::new(Scheduler::default());
        if auto_sync {
            scheduler.enabled.set(true);
            scheduler::watch_connectivity(&inner, &scheduler);
            if realtime_wakeups {
                scheduler::open_wake_stream(&inner, &scheduler);
            }
            scheduler::arm(&inner, &scheduler);
        }
        Ok(KizunaClient { inner, scheduler, lock: RefCell::new(lock) })
    }

    fn run<F>(&self, body: impl FnOnce(Rc<Inner>, Rc<Scheduler>) -> F) -> Promise
    where
        F: std::future::Future<Output = Result<JsValue, JsValue>> + 'static,
    {
        if self.inner.closed.get() {
            return Promise::reject(&ClientError::new("CLIENT_CLOSED", "this client was closed").into());
        }
        future_to_promise(body(self.inner.clone(), self.scheduler.clone()))
    }

    fn write(&self, writes: Vec<LocalWrite>) -> Promise {
        self.run(|inner, scheduler| async move {
            inner.write(writes).await?;
            scheduler::arm(&inner, &scheduler);
            Ok(JsValue::UNDEFINED)
        })
    }
}

#[wasm_bindgen]
impl KizunaClient {
    /// Opens (or creates) the local database and restores the outbox; starts the sync loops unless
    /// `autoSync: false`.
    #[wasm_bindgen(unchecked_return_type = "Promise<KizunaClient>")]
    pub fn open(#[wasm_bindgen(unchecked_param_type = "ClientOptions")] options: JsValue) -> Promise {
        future_to_promise(async move { Self::connect(options).await.map(JsValue::from) })
    }

    /// Writes a whole row locally (visible at once) and queues it for the server.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn put(&self, table: String, pk: String, #[wasm_bindgen(unchecked_param_type = "Row")] row: JsValue,
               #[wasm_bindgen(unchecked_param_type = "WriteOptions | undefined")] options: JsValue) -> Promise {
        match row_from_js(row, "row").and_then(|row| single_write(table, pk, Op::Upsert, Some(row), options)) {
            Ok(w) => self.write(vec![w]),
            Err(e) => Promise::reject(&e),
        }
    }

    /// Assigns only the named columns, locally and on the server.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn patch(&self, table: String, pk: String, #[wasm_bindgen(unchecked_param_type = "Row")] columns: JsValue,
                 #[wasm_bindgen(unchecked_param_type = "WriteOptions | undefined")] options: JsValue) -> Promise {
        match row_from_js(columns, "columns").and_then(|c| single_write(table, pk, Op::Patch, Some(c), options)) {
            Ok(w) => self.write(vec![w]),
            Err(e) => Promise::reject(&e),
        }
    }

    /// Deletes the row locally and queues the delete.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn delete(&self, table: String, pk: String,
                  #[wasm_bindgen(unchecked_param_type = "WriteOptions | undefined")] options: JsValue) -> Promise {
        match single_write(table, pk, Op::Delete, None, options) {
            Ok(w) => self.write(vec![w]),
            Err(e) => Promise::reject(&e),
        }
    }

    /// Several writes as one atomic group: stored in one local transaction and applied by the
    /// server all or nothing.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn batch(&self, #[wasm_bindgen(unchecked_param_type = "BatchWrite[]")] writes: JsValue) -> Promise {
        let parsed = (|| -> Result<Vec<LocalWrite>, JsValue> {
            let list: js_sys::Array = writes.dyn_into().map_err(|_| invalid("batch takes an array of writes"))?;
            if list.length() == 0 {
                return Err(invalid("batch takes at least one write"));
            }
            list.iter()
                .enumerate()
                .map(|(i, w)| {
                    let field = |k: &str| Reflect::get(&w, &k.into()).ok().and_then(|v| v.as_string());
                    let table = field("table").ok_or_else(|| invalid(format!("writes[{i}].table must be a string")))?;
                    let pk = field("pk").ok_or_else(|| invalid(format!("writes[{i}].pk must be a string")))?;
                    let (op, columns) = match field("op").as_deref() {
                        Some("upsert") => (Op::Upsert, Some(row_from_js(Reflect::get(&w, &"row".into()).unwrap_or_default(), &format!("writes[{i}].row"))?)),
                        Some("patch") => (Op::Patch, Some(row_from_js(Reflect::get(&w, &"columns".into()).unwrap_or_default(), &format!("writes[{i}].columns"))?)),
                        Some("delete") => (Op::Delete, None),
                        _ => return Err(invalid(format!("writes[{i}].op must be \"upsert\", \"patch\" or \"delete\""))),
                    };
                    Ok(LocalWrite { table, pk, op, columns, apply_after: None, latest_only: None })
                })
                .collect()
        })();
        match parsed {
            Ok(ws) => self.write(ws),
            Err(e) => Promise::reject(&e),
        }
    }

    /// The visible row, or null.
    #[wasm_bindgen(unchecked_return_type = "Promise<Row | null>")]
    pub fn get(&self, table: String, pk: String) -> Promise {
        self.run(|inner, _| async move {
            let record = inner.store.get_row(&table, &pk).await?;
            Ok(record.and_then(|r| r.visible).map(|row| to_js(&Value::Object(row))).unwrap_or(JsValue::NULL))
        })
    }

    /// Every visible row of a table.
    #[wasm_bindgen(unchecked_return_type = "Promise<Row[]>")]
    pub fn list(&self, table: String) -> Promise {
        self.run(|inner, _| async move { Ok(rows_to_js(inner.store.rows_where("table", &table).await?)) })
    }

    /// Visible rows of a table whose columns equal every value in `where`; `bucket` narrows to one
    /// bucket through its index.
    #[wasm_bindgen(unchecked_return_type = "Promise<Row[]>")]
    pub fn query(&self, table: String,
                 #[wasm_bindgen(unchecked_param_type = "{ where?: Row; bucket?: string }")] filter: JsValue) -> Promise {
        let parsed = (|| -> Result<(Row, Option<String>), JsValue> {
            if filter.is_undefined() || filter.is_null() {
                return Ok((Row::new(), None));
            }
            let w = Reflect::get(&filter, &"where".into()).unwrap_or_default();
            let conditions = if w.is_undefined() { Row::new() } else { row_from_js(w, "filter.where")? };
            let bucket = Reflect::get(&filter, &"bucket".into()).ok().and_then(|b| b.as_string());
            Ok((conditions, bucket))
        })();
        let (conditions, bucket) = match parsed {
            Ok(p) => p,
            Err(e) => return Promise::reject(&e),
        };
        self.run(|inner, _| async move {
            let records = match &bucket {
                Some(b) => inner.store.rows_where("bucket", b).await?.into_iter().filter(|r| r.table == table).collect(),
                None => inner.store.rows_where("table", &table).await?,
            };
            let matching = records
                .into_iter()
                .filter(|r| r.visible.as_ref().is_some_and(|row| conditions.iter().all(|(k, v)| row.get(k) == Some(v))))
                .collect();
            Ok(rows_to_js(matching))
        })
    }

    /// Pushes what is due, then pulls to the next committed checkpoint.
    #[wasm_bindgen(unchecked_return_type = "Promise<SyncReport>")]
    pub fn sync(&self) -> Promise {
        self.run(|inner, scheduler| async move {
            let outcome = inner.sync().await;
            scheduler::arm(&inner, &scheduler);
            Ok(to_js(&outcome?.to_json()))
        })
    }

    /// Pulls to the next committed checkpoint without pushing.
    #[wasm_bindgen(unchecked_return_type = "Promise<boolean>")]
    pub fn pull(&self) -> Promise {
        self.run(|inner, scheduler| async move {
            let outcome = inner.pull().await;
            scheduler::arm(&inner, &scheduler);
            Ok(JsValue::from_bool(outcome?))
        })
    }

    /// The committed checkpoint: cursor, horizon and when it was committed.
    #[wasm_bindgen(js_name = getCheckpoint, unchecked_return_type = "Checkpoint")]
    pub fn get_checkpoint(&self) -> JsValue {
        let c = self.inner.checkpoint.borrow();
        to_js(&json!({ "cursor": c.cursor, "horizon": c.horizon, "committedAt": c.committed_at }))
    }

    #[wasm_bindgen(js_name = getSyncHealth, unchecked_return_type = "SyncHealth")]
    pub fn get_sync_health(&self) -> JsValue {
        let h = self.inner.engine.borrow().health(now());
        to_js(&json!({
            "failureStreak": h.failure_streak, "lastError": h.last_error, "lastSuccessAt": h.last_success_at,
            "inFlight": h.in_flight, "online": h.online,
        }))
    }

    #[wasm_bindgen(unchecked_return_type = "SyncStatus")]
    pub fn status(&self) -> JsValue {
        let s = self.inner.engine.borrow().status();
        to_js(&json!({
            "pending": s.pending, "retrying": s.retrying, "deadLetters": s.dead_letters,
            "applied": s.applied, "rejected": s.rejected, "skipped": s.skipped, "delayed": s.delayed,
        }))
    }

    /// The writes waiting in the outbox, oldest first.
    #[wasm_bindgen(js_name = pendingWrites)]
    pub fn pending_writes(&self) -> JsValue {
        to_js(&self.inner.engine.borrow().outbox().collect::<Vec<_>>())
    }

    /// Writes moved out of the queue after exhausting their budget, kept until requeued or discarded.
    #[wasm_bindgen(js_name = deadLetters)]
    pub fn dead_letters(&self) -> JsValue {
        to_js(self.inner.engine.borrow().dead_letters())
    }

    /// Puts a dead letter back in the queue with a fresh budget (and a new id and sequence number).
    #[wasm_bindgen(js_name = requeueDeadLetter, unchecked_return_type = "Promise<void>")]
    pub fn requeue_dead_letter(&self, seq: f64) -> Promise {
        self.run(|inner, scheduler| async move {
            inner.requeue_dead(seq as i64).await?;
            scheduler::arm(&inner, &scheduler);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Drops a dead letter for good and restores the row it had changed.
    #[wasm_bindgen(js_name = discardDeadLetter, unchecked_return_type = "Promise<void>")]
    pub fn discard_dead_letter(&self, seq: f64) -> Promise {
        self.run(|inner, _| async move {
            inner.discard_dead(seq as i64).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Subscribes to an event; returns a function that unsubscribes.
    #[wasm_bindgen(unchecked_return_type = "() => void")]
    pub fn on(&self, #[wasm_bindgen(unchecked_param_type = "KizunaEventName")] name: String, listener: Function) -> Result<Function, JsValue> {
        if !EVENT_NAMES.contains(&name.as_str()) {
            return Err(invalid(format!("unknown event '{name}'; known: {}", EVENT_NAMES.join(", "))));
        }
        let id = self.inner.listeners.borrow_mut().add(&name, listener);
        let listeners = Rc::downgrade(&self.inner.listeners);
        let off = Closure::once_into_js(move || {
            if let Some(l) = listeners.upgrade() {
                l.borrow_mut().remove(id);
            }
        });
        Ok(off.unchecked_into())
    }

    /// Stops the loops, closes the database and lets another client open it. Pending writes stay
    /// in the outbox for next time. Closing twice does nothing more.
    pub fn close(&self) {
        self.inner.closed.set(true);
        scheduler::stop(&self.scheduler);
        self.inner.store.close();
        self.lock.borrow_mut().release();
    }
}

/// A client freed from JS (or dropped in Rust) without `close()` must not leave its timer, wake
/// stream and online listeners calling into closures that no longer exist.
impl Drop for KizunaClient {
    fn drop(&mut self) {
        self.close();
    }
}
