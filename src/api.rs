//! The JS face of the package: `KizunaClient.open(options)` and the methods on the client.
//! Every method validates its input and answers with a settled promise: a bad argument is an
//! `Error` with `code: "INVALID_ARGUMENT"` and stores nothing.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures_util::lock::Mutex;
use js_sys::{Function, Promise, Reflect};
use kizuna_engine::{Engine, LocalWrite, RowKey};
use kizuna_protocol::{Op, Row};
use serde_json::json;
use uuid::Uuid;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::future_to_promise;

use crate::error::ClientError;
use crate::events::{Listeners, EVENT_NAMES};
use crate::js;
use crate::runner::{now, ClosedViews, Inner};
use crate::scheduler::{self, Scheduler};
use crate::options::ClientOptions;
use crate::store::Store;
use crate::tabs::{self, Tabs};
use crate::values;
use crate::watch::{self, Filter, Watches};


/// An offline-first client over one IndexedDB database. Its TypeScript declaration is written by
/// hand in `typescript.rs` (generic over the app's tables), so wasm-bindgen's is skipped.
#[wasm_bindgen(skip_typescript)]
pub struct KizunaClient {
    inner: Rc<Inner>,
}

pub(crate) fn invalid(message: impl Into<String>) -> JsValue {
    ClientError::invalid(message).into()
}

fn to_js<T: serde::Serialize + ?Sized>(value: &T) -> JsValue {
    js::encode(value).unwrap_or(JsValue::NULL)
}

/// The function `on()` and `watch()` hand back: callable again, doing nothing more (a cleanup that
/// runs twice), where a once-only closure threw wasm-bindgen's error, with no code, on the second call.
fn unsubscriber(stop: impl FnMut() + 'static) -> Function {
    Closure::<dyn FnMut()>::new(stop).into_js_value().unchecked_into()
}

/// A write's options: `applyAfter` and `latestOnly`; any other key is refused, so a misspelt
/// option fails loudly.
fn write_options(options: Option<JsValue>) -> Result<(Option<i64>, Option<bool>), JsValue> {
    let Some(options) = values::options(&options.unwrap_or(JsValue::UNDEFINED), "options")? else { return Ok((None, None)) };
    if let Some(key) = values::unknown_key(&options, &"options", &["applyAfter", "latestOnly"])? {
        return Err(invalid(format!("unknown write option '{key}'; known: applyAfter, latestOnly")));
    }
    let after = values::property(&options, "applyAfter", &"options")?;
    let apply_after = if after.is_undefined() || after.is_null() { None } else { Some(values::instant(&after, "options.applyAfter")?) };
    let latest = values::property(&options, "latestOnly", &"options")?;
    let latest_only = if latest.is_undefined() { None } else { Some(latest.as_bool().ok_or_else(|| invalid("options.latestOnly must be a boolean"))?) };
    Ok((apply_after, latest_only))
}

fn single_write(table: &JsValue, pk: &JsValue, op: Op, columns: Option<Row>, options: Option<JsValue>) -> Result<LocalWrite, JsValue> {
    let (apply_after, latest_only) = write_options(options)?;
    Ok(LocalWrite { table: values::text(table, "table")?, pk: values::text(pk, "pk")?, op, columns, apply_after, latest_only })
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


impl KizunaClient {
    /// `open` for Rust callers (the browser tests drive the same code path JS does).
    pub async fn connect(options: JsValue) -> Result<KizunaClient, JsValue> {
        let ClientOptions { name, indexes, config, transport, auto_sync, realtime_wakeups, staging_memory_bytes } = ClientOptions::parse(&options)?;
        // With what a page that went away (a reload as a step committed) kept and did not tell.
        let (store, unheard) = Store::open(&name, indexes, staging_memory_bytes).await?;
        let (state, stamp) = store.load().await?;
        let state = match state {
            Some(state) => state,
            None => {
                // The first tab to open a new database writes its identity; a tab that raced it
                // there finds it written and takes it.
                let txn = store.begin().await?;
                let state = match txn.load_state().await? {
                    Some(state) => state,
                    None => {
                        let fresh = Engine::fresh_state(random_uuid());
                        txn.apply(&[kizuna_engine::StoreOp::PutMeta(fresh.meta.clone())])?;
                        fresh
                    }
                };
                txn.commit().await?;
                state
            }
        };
        let seed = random_seed();
        let engine = Engine::new(config.clone(), state, seed);
        let checkpoint = engine.checkpoint().clone();
        let tab = random_uuid().to_string();
        let inner = Rc::new_cyclic(|me| Inner {
            store,
            engine: RefCell::new(engine),
            config,
            transport,
            listeners: Rc::new(RefCell::new(Listeners::default())),
            activity: Mutex::new(()),
            closed: Cell::new(false),
            seed: Cell::new(seed),
            checkpoint: RefCell::new(checkpoint),
            version: Cell::new(stamp.version),
            leader_named: RefCell::new(stamp.leader.clone()),
            reloads: Cell::new(0),
            unsettled_writes: Cell::new(0),
            tabs: Tabs::new(&name, tab, js_sys::Math::random()),
            scheduler: Rc::new(Scheduler::default()),
            watches: Watches::default(),
            auto_sync,
            realtime_wakeups,
            me: me.clone(),
            unheard_kept: Cell::new(0),
            closed_views: RefCell::new(None),
        });
        tabs::join(&inner);
        inner.tell_unheard(inner.version.get(), unheard);
        Ok(KizunaClient { inner })
    }

    fn run<F>(&self, body: impl FnOnce(Rc<Inner>) -> F) -> Promise
    where
        F: std::future::Future<Output = Result<JsValue, JsValue>> + 'static,
    {
        if self.inner.closed.get() {
            return Promise::reject(&ClientError::new("CLIENT_CLOSED", "this client was closed").into());
        }
        future_to_promise(body(self.inner.clone()))
    }

    /// `run` with checked arguments: a refused argument is the promise's rejection, and nothing
    /// runs.
    fn run_checked<A, F>(&self, args: Result<A, JsValue>, body: impl FnOnce(A, Rc<Inner>) -> F) -> Promise
    where
        F: std::future::Future<Output = Result<JsValue, JsValue>> + 'static,
    {
        match args {
            Ok(args) => self.run(|inner| body(args, inner)),
            Err(e) => Promise::reject(&e),
        }
    }

    fn write(&self, writes: Result<Vec<LocalWrite>, JsValue>) -> Promise {
        self.run_checked(writes, |writes, inner| async move {
            inner.write(writes).await?;
            scheduler::arm(&inner);
            Ok(JsValue::UNDEFINED)
        })
    }
}

#[wasm_bindgen]
impl KizunaClient {
    /// Opens (or creates) the local database and restores the outbox; starts the sync loops unless
    /// `autoSync: false`.
    #[wasm_bindgen(skip_typescript)]
    pub fn open(options: JsValue) -> Promise {
        future_to_promise(async move { Self::connect(options).await.map(JsValue::from) })
    }

    /// Creates the row, or assigns the columns it names when the row exists (the others keep
    /// their values), locally at once and then on the server.
    #[wasm_bindgen(skip_typescript)]
    pub fn put(&self, table: JsValue,
               pk: JsValue,
               row: JsValue,
               options: Option<JsValue>) -> Promise {
        self.write(values::row(&row, "row").and_then(|row| single_write(&table, &pk, Op::Upsert, Some(row), options)).map(|w| vec![w]))
    }

    /// Assigns only the named columns of an existing row, locally and on the server.
    #[wasm_bindgen(skip_typescript)]
    pub fn patch(&self, table: JsValue,
                 pk: JsValue,
                 columns: JsValue,
                 options: Option<JsValue>) -> Promise {
        self.write(values::row(&columns, "columns").and_then(|c| single_write(&table, &pk, Op::Patch, Some(c), options)).map(|w| vec![w]))
    }

    /// Deletes the row locally and queues the delete.
    #[wasm_bindgen(skip_typescript)]
    pub fn delete(&self, table: JsValue,
                  pk: JsValue,
                  options: Option<JsValue>) -> Promise {
        self.write(single_write(&table, &pk, Op::Delete, None, options).map(|w| vec![w]))
    }

    /// Several writes as one atomic group: stored in one local transaction and applied by the
    /// server all or nothing.
    #[wasm_bindgen(skip_typescript)]
    pub fn batch(&self, writes: JsValue) -> Promise {
        let parsed = (|| -> Result<Vec<LocalWrite>, JsValue> {
            if !writes.has_type::<js_sys::Array>() {
                return Err(invalid("batch takes an array of writes"));
            }
            let list = values::items(&writes, &"writes")?;
            if list.is_empty() {
                return Err(invalid("batch takes at least one write"));
            }
            // The members' property names, each made a JS string once: made for each read, a
            // batch of 1,000 decoded 6,000 of them.
            let names = values::PropertyNames::new(["op", "table", "pk", "row", "columns"]);
            list.into_iter()
                .enumerate()
                .map(|(i, w)| {
                    let field = |k: &str| names.read(&w, k, &format_args!("writes[{i}]"));
                    // As a write's options: what a member does not take is refused, never dropped
                    // (an `applyAfter` here would have been sent at once).
                    if !w.is_object() {
                        return Err(invalid(format!("writes[{i}] must be an object {{op, table, pk, row | columns}}")));
                    }
                    let op = field("op")?.as_string();
                    let takes: &[&str] = match op.as_deref() {
                        Some("upsert") => &["op", "table", "pk", "row"],
                        Some("patch") => &["op", "table", "pk", "columns"],
                        _ => &["op", "table", "pk"],
                    };
                    if let Some(key) = values::unknown_key(&w, &format_args!("writes[{i}]"), takes)? {
                        return Err(invalid(format!("writes[{i}] has '{key}', which a batch write of its op does not take (known: {})", takes.join(", "))));
                    }
                    let table = values::text(&field("table")?, format_args!("writes[{i}].table"))?;
                    let pk = values::text(&field("pk")?, format_args!("writes[{i}].pk"))?;
                    let (op, columns) = match op.as_deref() {
                        Some("upsert") => (Op::Upsert, Some(values::row(&field("row")?, format_args!("writes[{i}].row"))?)),
                        Some("patch") => (Op::Patch, Some(values::row(&field("columns")?, format_args!("writes[{i}].columns"))?)),
                        Some("delete") => (Op::Delete, None),
                        _ => return Err(invalid(format!("writes[{i}].op must be \"upsert\", \"patch\" or \"delete\""))),
                    };
                    Ok(LocalWrite { table, pk, op, columns, apply_after: None, latest_only: None })
                })
                .collect()
        })();
        self.write(parsed)
    }

    /// The visible row, or null.
    #[wasm_bindgen(skip_typescript)]
    pub fn get(&self, table: JsValue,
               pk: JsValue) -> Promise {
        let args = values::text(&table, "table").and_then(|t| Ok((t, values::text(&pk, "pk")?)));
        self.run_checked(args, |(table, pk), inner| async move {
            // As `list` and `query` hand rows back: the stored record as the browser read it.
            let records = inner.store.records(&[RowKey::new(table, pk)]).await?;
            Ok(records.first().and_then(watch::visible_row).unwrap_or(JsValue::NULL))
        })
    }

    /// Every visible row of a table.
    #[wasm_bindgen(skip_typescript)]
    pub fn list(&self, table: JsValue) -> Promise {
        self.run_checked(values::text(&table, "table"), |table, inner| async move {
            Ok(Filter::default().rows(&inner, &table).await?.into())
        })
    }

    /// Visible rows of a table whose columns equal every value in `where`; `bucket` narrows to one
    /// bucket through its index.
    #[wasm_bindgen(skip_typescript)]
    pub fn query(&self, table: JsValue, filter: Option<JsValue>) -> Promise {
        let parsed = values::text(&table, "table").and_then(|t| Ok((t, Filter::parse(filter)?)));
        self.run_checked(parsed, |(table, filter), inner| async move {
            Ok(filter.rows(&inner, &table).await?.into())
        })
    }

    /// A live query: `listener` gets the rows of `table` that `filter` admits soon after the call,
    /// then again after every committed change that alters them (local writes in any tab, pulls,
    /// verdicts, compensations, rehydration). Returns the function that stops it.
    #[wasm_bindgen(skip_typescript)]
    pub fn watch(&self, table: JsValue, filter: JsValue, listener: JsValue) -> Result<Function, JsValue> {
        if self.inner.closed.get() {
            return Err(ClientError::new("CLIENT_CLOSED", "this client was closed").into());
        }
        let table = values::text(&table, "table")?;
        let filter = Filter::parse(Some(filter))?;
        let listener: Function = listener.dyn_into().map_err(|_| invalid("listener must be a function"))?;
        let id = watch::watch(&self.inner, table, filter, listener);
        let inner = Rc::downgrade(&self.inner);
        Ok(unsubscriber(move || {
            if let Some(inner) = inner.upgrade() {
                watch::unwatch(&inner, id);
            }
        }))
    }

    /// Pushes what is due, then pulls to the next committed checkpoint.
    #[wasm_bindgen(skip_typescript)]
    pub fn sync(&self) -> Promise {
        self.run(|inner| async move {
            if !inner.tabs.leading() {
                return tabs::forward(&inner, "sync").await;
            }
            let outcome = inner.sync().await;
            scheduler::arm(&inner);
            Ok(to_js(&outcome?.to_json()))
        })
    }

    /// Pulls to the next committed checkpoint without pushing.
    #[wasm_bindgen(skip_typescript)]
    pub fn pull(&self) -> Promise {
        self.run(|inner| async move {
            if !inner.tabs.leading() {
                return tabs::forward(&inner, "pull").await;
            }
            let outcome = inner.pull().await;
            scheduler::arm(&inner);
            Ok(JsValue::from_bool(outcome?))
        })
    }

    /// The committed checkpoint: cursor, horizon and when it was committed.
    #[wasm_bindgen(skip_typescript, js_name = getCheckpoint)]
    pub fn get_checkpoint(&self) -> JsValue {
        let c = self.inner.checkpoint.borrow();
        let buckets = c.buckets.clone().unwrap_or_else(|| self.inner.config.buckets.clone());
        to_js(&json!({ "cursor": c.cursor, "horizon": c.horizon, "committedAt": c.committed_at, "buckets": buckets }))
    }

    #[wasm_bindgen(skip_typescript, js_name = getSyncHealth)]
    pub fn get_sync_health(&self) -> JsValue {
        self.view(|v| &v.health, |i| i.health_json().to_string())
    }

    #[wasm_bindgen(skip_typescript)]
    pub fn status(&self) -> JsValue {
        self.view(|v| &v.status, |i| i.status_json().to_string())
    }

    /// The writes waiting in the outbox, oldest first.
    #[wasm_bindgen(skip_typescript, js_name = pendingWrites)]
    pub fn pending_writes(&self) -> JsValue {
        self.view(|v| &v.pending, Inner::pending_text)
    }

    /// Writes moved out of the queue after exhausting their budget, kept until requeued or discarded.
    #[wasm_bindgen(skip_typescript, js_name = deadLetters)]
    pub fn dead_letters(&self) -> JsValue {
        self.view(|v| &v.dead, Inner::dead_text)
    }

    /// Puts a dead letter back in the queue with a fresh budget (and a new id and sequence number).
    #[wasm_bindgen(skip_typescript, js_name = requeueDeadLetter)]
    pub fn requeue_dead_letter(&self, seq: JsValue) -> Promise {
        self.run_checked(dead_letter_seq(&seq), |seq, inner| async move {
            inner.requeue_dead(seq).await?;
            scheduler::arm(&inner);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Drops a dead letter for good and restores the row it had changed.
    #[wasm_bindgen(skip_typescript, js_name = discardDeadLetter)]
    pub fn discard_dead_letter(&self, seq: JsValue) -> Promise {
        self.run_checked(dead_letter_seq(&seq), |seq, inner| async move {
            inner.discard_dead(seq).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Subscribes to an event; returns a function that unsubscribes.
    #[wasm_bindgen(skip_typescript)]
    // TypeScript sees the generic signature of the `KizunaClient` interface above, which types each
    // listener by its event; `never` keeps it from settling on this untyped one instead.
    pub fn on(&self, name: JsValue,
              listener: JsValue) -> Result<Function, JsValue> {
        let name = values::text(&name, "name")?;
        if !EVENT_NAMES.contains(&name.as_str()) {
            return Err(invalid(format!("unknown event '{name}'; known: {}", EVENT_NAMES.join(", "))));
        }
        let listener: Function = listener.dyn_into().map_err(|_| invalid("listener must be a function"))?;
        let id = self.inner.listeners.borrow_mut().add(&name, listener);
        // Events a page that went away had kept and not told (a reload during a commit), held
        // for the first listener: told once `on` has returned.
        let held = self.inner.listeners.borrow_mut().take_held(&name);
        if !held.is_empty() {
            let listeners = self.inner.listeners.clone();
            wasm_bindgen_futures::spawn_local(async move { crate::events::emit(&listeners, &held) });
        }
        let listeners = Rc::downgrade(&self.inner.listeners);
        Ok(unsubscriber(move || {
            if let Some(l) = listeners.upgrade() {
                l.borrow_mut().remove(id);
            }
        }))
    }

    /// `free()`: closes the client (as `close()` does, its engine let go) and leaves the JS object
    /// a closed client, whose later calls are refused with `CLIENT_CLOSED`. It stands in for
    /// wasm-bindgen's own `free()`, which freed the object itself: every later call then threw
    /// wasm-bindgen's "null pointer passed to rust", an Error without a code. (The JS class takes
    /// the later of two methods of one name, and wasm-bindgen writes its own first; a browser
    /// test calls `free()` and then the client.) The object's few bytes go when JS collects it.
    #[wasm_bindgen(skip_typescript, js_name = free)]
    pub fn free_closing(&self) {
        self.close();
    }

    /// Stops the loops, closes the database and lets another client open it. Pending writes stay
    /// in the outbox for next time. Closing twice does nothing more. A closed client tells its
    /// listeners nothing more: what a step still committing says of writes is kept with it and
    /// told by the next client to open the database.
    #[wasm_bindgen(skip_typescript)]
    pub fn close(&self) {
        if self.shut() {
            // Once the steps still running have ended, the engine is let go (`Inner::let_go`); in
            // a task of its own, as the last step may end inside code that holds the engine.
            let me = Rc::downgrade(&self.inner);
            self.inner.store.when_idle(Box::new(move || {
                wasm_bindgen_futures::spawn_local(async move {
                    if let Some(inner) = me.upgrade() {
                        inner.let_go();
                    }
                })
            }));
        }
    }
}

impl KizunaClient {
    /// Stops the loops, the listeners and the live queries and closes the database; false when
    /// the client was closed already.
    fn shut(&self) -> bool {
        if self.inner.closed.replace(true) {
            return false;
        }
        self.inner.listeners.borrow_mut().clear();
        scheduler::stop(&self.inner.scheduler);
        tabs::leave(&self.inner);
        self.inner.watches.clear();
        self.inner.store.close();
        true
    }

    /// A status getter's answer: built from the engine, or, once a closed client has let go of
    /// it, parsed from the text kept then.
    fn view(&self, kept: fn(&ClosedViews) -> &js_sys::JsString, live: fn(&Inner) -> String) -> JsValue {
        match self.inner.closed_views.borrow().as_ref() {
            Some(views) => parse_js_string(kept(views)).unwrap_or(JsValue::NULL),
            None => js_sys::JSON::parse(&live(&self.inner)).unwrap_or(JsValue::NULL),
        }
    }
}

#[wasm_bindgen]
extern "C" {
    /// `JSON.parse` of text held in a JS string, without copying it into wasm memory (js_sys's
    /// takes a Rust `&str`).
    #[wasm_bindgen(js_namespace = JSON, js_name = parse, catch)]
    fn parse_js_string(text: &js_sys::JsString) -> Result<JsValue, JsValue>;
}

/// A client freed from JS (or dropped in Rust) without `close()` must not leave its timer, wake
/// stream and online listeners calling into closures that no longer exist. Its engine goes with it.
impl Drop for KizunaClient {
    fn drop(&mut self) {
        self.shut();
    }
}

/// True when `error` is an error this package threw or rejected with: an `Error` named
/// `KizunaError` with a string `code`.
#[wasm_bindgen(js_name = isKizunaError, skip_typescript)]
pub fn is_kizuna_error(error: JsValue) -> bool {
    error.is_instance_of::<js_sys::Error>()
        && Reflect::get(&error, &"name".into()).ok().and_then(|n| n.as_string()).as_deref() == Some("KizunaError")
        && Reflect::get(&error, &"code".into()).ok().is_some_and(|c| c.is_string())
}

/// A dead letter's `seq`: a whole number, refused otherwise (a string, a BigInt or null had been
/// turned into a number by the binding, or thrown a TypeError with no code).
fn dead_letter_seq(seq: &JsValue) -> Result<i64, JsValue> {
    let n = seq.as_f64().ok_or_else(|| invalid("seq must be a number: the seq of a dead letter"))?;
    values::whole_number(n, "seq")
}
