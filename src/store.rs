//! Kizuna's IndexedDB layout and the one way engine steps reach it.
//!
//! Every engine step that changes state runs inside a read-write transaction over all stores
//! (`Store::begin`): IndexedDB runs such transactions one at a time in the order they were created,
//! so the engine's order of steps and the store's order of commits are the same order.
//!
//! Every tab of one origin may hold the database open at once. The `sync` record carries a stamp
//! that every committing step advances and the tab that runs the sync loops: a step that finds the
//! stamp moved since its engine last saw it reloads the engine's state inside its own transaction
//! first, and a leader's step that finds another leader named is refused (see `tabs.rs`). It also
//! holds the engine's `meta` record and the declared indexes (`sync_record`), so that a step reads
//! one record and puts one.

use std::borrow::Cow;
use std::collections::BTreeMap;

use indexed_db_futures::database::{Database, VersionChangeEvent};
use indexed_db_futures::future::GetAllPrimitiveRequest;
use indexed_db_futures::internals::SystemRepr;
use indexed_db_futures::object_store::ObjectStore;
use indexed_db_futures::prelude::*;
use indexed_db_futures::transaction::{Transaction, TransactionMode};
use indexed_db_futures::KeyPath;
use js_sys::Array;
use kizuna_engine::{CommitPlan, Event, PersistedState, Placement, RowKey, RowRecord, StoreOp};
use kizuna_protocol::Entry;
use serde::{de::DeserializeOwned, Serialize};
use wasm_bindgen::prelude::*;

use crate::chunks::{Unchunking, CHUNKS};
use crate::error::ClientError;
use crate::indexes::Indexes;
use crate::js;
use crate::pages::{PageText, StagedEntry};
use crate::row_reads::RowReads;

/// The rows, with the tokens of the app's declared equality indexes (schema 2).
const ROWS: &str = "rows_v2";
/// Schema 1's rows: moved into `ROWS` by the first open of schema 2, then left empty.
const LEGACY_ROWS: &str = "rows";
const OUTBOX: &str = "outbox";
const DEAD: &str = "dead";
const STAGING: &str = "staging";
const META: &str = "meta";
const ALL: [&str; 6] = [ROWS, CHUNKS, OUTBOX, DEAD, STAGING, META];
/// The `sync` record (`sync_record`).
const SYNC_KEY: &str = "sync";
/// Schema 2's records of the engine's meta and of the declared indexes, apart from `sync`: folded
/// into it by the first open of schema 3 (`Store::settle`).
const LEGACY_META_KEY: &str = "meta";
const LEGACY_INDEXES_KEY: &str = "indexes";
/// The keys of events a step committed and its tab may not have told yet (see `WriteTxn::put_unheard`):
/// `unheard:` and a suffix that sorts them in commit order.
const UNHEARD: &str = "unheard:";
/// Past every `UNHEARD` key (`;` follows `:`).
const PAST_UNHEARD: &str = "unheard;";
/// How the stored tokens write their values (`indexes::token`); tokens of another form are remade.
const TOKEN_FORM_KEY: &str = "tokenForm";
/// 2: a number in one form for each double (a server's `5.00` was `5.0`, apart from the app's `5`).
const TOKEN_FORM: f64 = 2.0;
/// 3: the engine's meta and the declared indexes live in the `sync` record.
/// 4: the rows have no `table` index. Their `[table, pk]` key keeps a table's rows together, so a
/// read of one table is a key range (`table_range`), and every row put updated one index for
/// nothing (a first sync's puts took about 6 % longer with it, in raw IndexedDB).
/// 5: the rows a run from `null` brings are stored by the hundred (`chunks.rs`).
const SCHEMA_VERSION: u32 = 5;
/// Rows moved or re-tokened per request while a schema or declaration changes.
const CHUNK: u32 = 2_000;

pub struct Store {
    db: Database,
    /// The pull run's staged pages kept in memory, as committed.
    staged: std::cell::RefCell<StagedInMemory>,
    /// How many bytes of staged pages `staged` may hold.
    staging_memory_bytes: usize,
    /// The declared equality indexes every stored row carries tokens for: this tab's own from its
    /// open, and from then on those of the database, which the last tab to open set (it re-tokened
    /// every row). Tabs of two deploys may declare different ones: every step reads the database's
    /// (`begin_reading`), so each tab writes the tokens the others query by.
    indexes: std::cell::RefCell<Indexes>,
    /// The tables that may have rows in chunks (`chunks.rs`), as the `sync` record last read said:
    /// a write of their keys takes them out of their chunks.
    chunked: std::cell::RefCell<std::collections::BTreeSet<String>>,
    /// Steps whose read-write transaction is open (`OpenStep`).
    open_steps: std::cell::Cell<u32>,
    /// What runs once no step's transaction is open (`when_idle`).
    idle: std::cell::RefCell<Option<Box<dyn FnOnce()>>>,
    /// Set once a newer version of Kizuna in another tab asked for this database and this client
    /// closed its connection for it.
    upgraded_elsewhere: std::rc::Rc<std::cell::Cell<bool>>,
    /// The connection's `versionchange` handler, which lives as long as the store.
    _on_versionchange: Closure<dyn FnMut()>,
}

impl Drop for Store {
    fn drop(&mut self) {
        // The handler dies with the store: the connection must not call it afterwards.
        self.db.as_sys().set_onversionchange(None);
    }
}

/// The stamp of the `sync` record (`sync_record`): how many steps have committed (any tab's), and
/// which tab leads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncStamp {
    pub version: f64,
    pub leader: Option<String>,
}

impl SyncStamp {
    /// The stamp a step that changed something commits after this one.
    pub fn next(&self) -> SyncStamp {
        SyncStamp { version: self.version + 1.0, leader: self.leader.clone() }
    }
}

/// A field of a `sync` record, unless absent.
fn sync_field(record: &JsValue, name: &str) -> Option<JsValue> {
    present(js_sys::Reflect::get(record, &JsValue::from_str(name)).ok())
}

/// The tables a `sync` record says may have rows in chunks.
fn chunked_tables(record: Option<&JsValue>) -> std::collections::BTreeSet<String> {
    let Some(tables) = record.and_then(|r| sync_field(r, "chunked")) else { return Default::default() };
    kizuna_engine::order::set_of(Array::from(&tables).iter().filter_map(|t| t.as_string()))
}

/// The stamp of a `sync` record (none: the default, as of a database no step committed to).
fn stamp_of(record: Option<&JsValue>) -> Result<SyncStamp, ClientError> {
    let Some(record) = record else { return Ok(SyncStamp::default()) };
    let corrupt = || ClientError::new("STORAGE_CORRUPT", "the stamp of the sync record does not decode");
    let version = match sync_field(record, "version") {
        None => 0.0,
        Some(v) => v.as_f64().ok_or_else(corrupt)?,
    };
    let leader = match sync_field(record, "leader") {
        None => None,
        Some(l) => Some(l.as_string().ok_or_else(corrupt)?),
    };
    Ok(SyncStamp { version, leader })
}

/// The `sync` record `{version, leader, meta, indexes, chunked}`: the stamp, the engine's `meta`
/// record, the declared indexes the stored tokens were made for (absent: none declared) and the
/// tables that may have rows in chunks (`chunks.rs`; absent: none), each left out when absent.
/// One record, so that a step reads one and puts one: a write step that read the
/// stamp and the declaration and put the stamp and the meta apart made four requests, and in raw
/// IndexedDB in Chromium those two more were most of what the client's design added to a write's
/// own two puts (1.5 times them, against 1.17 for one read and one put).
fn sync_record(stamp: &SyncStamp, meta: Option<&JsValue>, indexes: Option<&JsValue>, chunked: Option<&JsValue>) -> JsValue {
    let record = js_sys::Object::new();
    let set = |name: &str, value: &JsValue| {
        let _ = js_sys::Reflect::set(&record, &JsValue::from_str(name), value);
    };
    set("version", &JsValue::from_f64(stamp.version));
    if let Some(leader) = &stamp.leader {
        set("leader", &JsValue::from_str(leader));
    }
    for (name, value) in [("meta", meta), ("indexes", indexes), ("chunked", chunked)] {
        if let Some(value) = value {
            set(name, value);
        }
    }
    record.into()
}

/// The default of `stagingMemoryBytes`: 32 MiB of a run's staged pages kept in memory.
pub const STAGING_MEMORY_BYTES: usize = 32 << 20;

/// The first pages of a pull run, staged in the page's JS memory (strings: not wasm memory, which
/// never shrinks) rather than in IndexedDB, up to `Store::staging_memory_bytes`; the rest go to the
/// `staging` store. A run is never resumed after a reload or by another tab (it starts over from
/// the committed cursor), so nothing is lost with them; writing each page to IndexedDB and reading
/// it back in the closing transaction was a sixth of a 100,000-row first sync.
#[derive(Default)]
struct StagedInMemory {
    /// Each page's text and its length in bytes, by page number (a run's pages are numbered from 0).
    pages: Vec<Option<(JsValue, usize)>>,
    bytes: usize,
}

/// What a transaction does to `StagedInMemory`, carried out once it commits.
enum StagingChange {
    Put(u32, JsValue, usize),
    Clear,
}

/// A staged row's text as a row.
fn staged_row(text: &str) -> Result<kizuna_protocol::Row, ClientError> {
    crate::pages::staged_row(text).map_err(|e| ClientError::new("STORAGE_CORRUPT", e))
}

/// Why database `name` did not open.
fn open_error(name: &str, e: indexed_db_futures::error::OpenDbError) -> ClientError {
    use indexed_db_futures::error::{DomException, Error, OpenDbError};
    match e {
        OpenDbError::UnsupportedEnvironment | OpenDbError::NullFactory => {
            ClientError::new("STORAGE_UNAVAILABLE", "IndexedDB is not available in this context")
        }
        OpenDbError::Base(Error::DomException(DomException::Other(e))) if e.name() == "VersionError" => ClientError::new(
            "STORAGE_UPGRADED",
            format!("database '{name}' was upgraded by a newer version of Kizuna (in another tab) past this version's schema {SCHEMA_VERSION}: reload this page"),
        ),
        other => failed(other),
    }
}

/// An IndexedDB failure, with the browser's words.
pub(crate) fn failed(e: impl std::fmt::Display) -> ClientError {
    ClientError::new("STORAGE_FAILED", e.to_string())
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, ClientError> {
    js::encode(value).map_err(|e| ClientError::new("STORAGE_FAILED", format!("cannot encode a record: {e}")))
}

pub(crate) fn from_js<T: DeserializeOwned>(value: JsValue) -> Result<T, ClientError> {
    js::decode(&value)
        .map_err(|e| ClientError::new("STORAGE_CORRUPT", format!("a stored record does not decode: {e}")))
}

pub(crate) fn row_key(table: &str, pk: &str) -> JsValue {
    Array::of2(&table.into(), &pk.into()).into()
}

/// `row_key` as JSON text, for keys that cross into JS inside a larger `JSON.parse` (`StepRecords`,
/// `ServerRows`).
fn write_row_key(text: &mut Vec<u8>, table: &str, pk: &str) -> serde_json::Result<()> {
    serde_json::to_writer(text, &[table, pk])
}

/// A key after every row key of `table`: IndexedDB orders an array after any string.
fn past_table(table: &str) -> JsValue {
    Array::of2(&table.into(), &Array::new()).into()
}

/// The row keys of `table`, after `after` when given.
fn table_range(table: &str, after: Option<&JsValue>) -> Result<web_sys::IdbKeyRange, ClientError> {
    let (lower, lower_open) = match after {
        Some(key) => (key.clone(), true),
        None => (row_key(table, ""), false),
    };
    web_sys::IdbKeyRange::bound_with_lower_open_and_upper_open(&lower, &past_table(table), lower_open, true).map_err(|e| failed(crate::error::describe(&e)))
}

/// Brings a database of any earlier schema to `SCHEMA_VERSION`. `opening` is the open request,
/// whose transaction changes the stores that exist already (the library hands the upgrade only
/// the database, which reaches the stores it creates).
fn upgrade(event: VersionChangeEvent, db: Database, opening: &web_sys::IdbOpenDbRequest) -> indexed_db_futures::Result<()> {
    let old = event.old_version();
    if old < 1.0 {
        for name in [OUTBOX, DEAD, STAGING, META] {
            db.create_object_store(name).build()?;
        }
    }
    if old < 2.0 {
        let rows = db.create_object_store(ROWS).build()?;
        rows.create_index("bucket", KeyPath::One("bucket")).with_unique(false).build()?;
        rows.create_index("eq", KeyPath::One("eq")).with_unique(false).with_multi_entry(true).build()?;
    } else if old < 4.0 {
        let upgrading = opening.transaction().ok_or_else(|| JsValue::from_str("the upgrade has no transaction"))?;
        upgrading.object_store(ROWS)?.delete_index("table")?;
    }
    if old < 5.0 {
        crate::chunks::create(&db)?;
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) database `name`, whose rows carry tokens for `indexes`: a database of
    /// schema 1 has its rows moved over, and rows stored under another declaration are re-tokened,
    /// each once, in one transaction, before anything else reads them. Returns with it the events
    /// a page that went away kept and did not tell (`WriteTxn::put_unheard`), taken in that same
    /// transaction, for this page to tell (once its app listens).
    pub async fn open(name: &str, indexes: Indexes, staging_memory_bytes: usize) -> Result<(Store, Vec<Event>), ClientError> {
        let store = Store::connect(name, indexes, staging_memory_bytes).await?;
        let unheard = store.settle().await?;
        Ok((store, unheard))
    }

    async fn connect(name: &str, indexes: Indexes, staging_memory_bytes: usize) -> Result<Store, ClientError> {
        // The browser fires `blocked` when a connection at an older schema (a tab still running an
        // earlier version of Kizuna, which does not let go) keeps the upgrade waiting: without an
        // answer the app's open() never settled.
        let mut tell_blocked: Option<js_sys::Function> = None;
        let blocked = js_sys::Promise::new(&mut |resolve, _| tell_blocked = Some(resolve));
        let tell_blocked = tell_blocked.expect("the Promise executor runs at once");
        // The upgrade runs once the request is made, so the request is handed to it after.
        let request: std::rc::Rc<std::cell::OnceCell<web_sys::IdbOpenDbRequest>> = Default::default();
        let upgrading = request.clone();
        let opening = Database::open(name)
            .with_version(SCHEMA_VERSION)
            .with_on_blocked(move |event| {
                let _ = tell_blocked.call1(&JsValue::NULL, &JsValue::from_f64(event.old_version()));
                Ok(())
            })
            .with_on_upgrade_needed(move |event, db| {
                let opening = upgrading.get().ok_or_else(|| JsValue::from_str("the upgrade ran before its request was made"))?;
                upgrade(event, db, opening)
            })
            .build()
            .map_err(|e| open_error(name, e))?;
        let _ = request.set(opening.as_sys().clone());
        let blocked = wasm_bindgen_futures::JsFuture::from(blocked);
        let opened = match futures_util::future::select(Box::pin(opening), blocked).await {
            futures_util::future::Either::Left((opened, _)) => opened,
            futures_util::future::Either::Right((old_version, opening)) => {
                // The upgrade still happens once that tab lets go; the connection it then opens
                // is nobody's, so it is closed (left open, it would hold up the next upgrade).
                wasm_bindgen_futures::spawn_local(async move {
                    if let Ok(db) = opening.await {
                        db.close();
                    }
                });
                let old = old_version.ok().and_then(|v| v.as_f64()).unwrap_or(0.0);
                return Err(ClientError::new(
                    "STORAGE_BLOCKED",
                    format!("another tab holds database '{name}' open at schema {old}, an earlier version of Kizuna that does not let go; this version needs schema {SCHEMA_VERSION}: close or reload that tab, then open again"),
                )
                .with_retryable(true));
            }
        };
        let db = opened.map_err(|e| open_error(name, e))?;
        let upgraded_elsewhere = std::rc::Rc::new(std::cell::Cell::new(false));
        // A newer version of Kizuna opening this database in another tab waits for every older
        // connection to close: this one lets go at once, and its steps then fail STORAGE_UPGRADED.
        let on_versionchange = {
            let (db, upgraded_elsewhere) = (db.clone(), upgraded_elsewhere.clone());
            Closure::<dyn FnMut()>::new(move || {
                upgraded_elsewhere.set(true);
                db.clone().close();
            })
        };
        db.as_sys().set_onversionchange(Some(on_versionchange.as_ref().unchecked_ref()));
        Ok(Store {
            db,
            staged: Default::default(),
            staging_memory_bytes,
            indexes: std::cell::RefCell::new(indexes),
            chunked: Default::default(),
            open_steps: Default::default(),
            idle: Default::default(),
            upgraded_elsewhere,
            _on_versionchange: on_versionchange,
        })
    }

    /// A transaction over `stores`, or why there is none.
    fn transaction_over<'a>(&'a self, stores: Vec<&str>, mode: TransactionMode) -> Result<Transaction<'a>, ClientError> {
        self.db.transaction(stores).with_mode(mode).build().map_err(|e| {
            if self.upgraded_elsewhere.get() {
                ClientError::new(
                    "STORAGE_UPGRADED",
                    "another tab opened this database with a newer version of Kizuna (or deleted it), and this client let go of it so that it could: reload this page",
                )
            } else {
                failed(e)
            }
        })
    }

    /// Moves schema 1's rows into `ROWS`, folds schema 2's `meta` and `indexes` records into the
    /// `sync` record, gives the rows of tables whose declared indexes changed their new tokens,
    /// and takes the events kept and not told.
    async fn settle(&self) -> Result<Vec<Event>, ClientError> {
        let legacy = self.db.object_store_names().any(|n| n == LEGACY_ROWS);
        let tx = self.transaction_over(if legacy { vec![LEGACY_ROWS, ROWS, CHUNKS, META] } else { vec![ROWS, CHUNKS, META] }, TransactionMode::Readwrite)?;
        let meta = store(&tx, META)?;
        let found = get(&meta, SYNC_KEY.into()).await?;
        let read = |name| found.as_ref().and_then(|r| sync_field(r, name));
        let (mut state, mut declared) = (read("meta"), read("indexes"));
        let mut folded = false;
        for (field, legacy_key) in [(&mut state, LEGACY_META_KEY), (&mut declared, LEGACY_INDEXES_KEY)] {
            if let Some(value) = get(&meta, legacy_key.into()).await? {
                field.get_or_insert(value);
                drop(meta.delete(JsValue::from_str(legacy_key)).primitive().map_err(failed)?);
                folded = true;
            }
        }
        let before: Indexes = declared.clone().map(from_js).transpose()?.unwrap_or_default();
        let own = self.indexes.borrow().clone();
        let mut retoken = crate::indexes::changed_tables(&before, &own);
        let form_changed = get(&meta, TOKEN_FORM_KEY.into()).await?.and_then(|f| f.as_f64()) != Some(TOKEN_FORM);
        if form_changed {
            retoken.extend(own.keys().cloned());
            kizuna_engine::order::sort(&mut retoken);
            retoken.dedup();
            drop(meta.put(JsValue::from_f64(TOKEN_FORM)).with_key(JsValue::from_str(TOKEN_FORM_KEY)).primitive().map_err(failed)?);
        }
        if legacy {
            let from = store(&tx, LEGACY_ROWS)?;
            self.rewrite(&from, &store(&tx, ROWS)?, None).await?;
            from.clear().map_err(failed)?;
        }
        let mut chunked = chunked_tables(found.as_ref());
        for table in &retoken {
            let rows = store(&tx, ROWS)?;
            self.rewrite(&rows, &rows, Some(table)).await?;
            // A declared table's rows carry tokens, which chunks do not hold: out of them.
            if chunked.remove(table) {
                self.unchunk_table(&store(&tx, CHUNKS)?, &rows, table).await?;
            }
        }
        if !retoken.is_empty() {
            declared = Some(to_js(&own)?);
        }
        if folded || !retoken.is_empty() {
            let chunked = (!chunked.is_empty()).then(|| to_js(&chunked)).transpose()?;
            let record = sync_record(&stamp_of(found.as_ref())?, state.as_ref(), declared.as_ref(), chunked.as_ref());
            drop(meta.put(record).with_key(JsValue::from_str(SYNC_KEY)).primitive().map_err(failed)?);
        }
        let unheard = take_unheard(&tx).await?;
        tx.commit().await.map_err(failed)?;
        Ok(unheard)
    }

    /// Writes every row of `from` (of `table` only, when given) into `to` with this store's tokens,
    /// `CHUNK` at a time.
    async fn rewrite(&self, from: &ObjectStore<'_>, to: &ObjectStore<'_>, table: Option<&String>) -> Result<(), ClientError> {
        let mut after: Option<JsValue> = None;
        loop {
            let range = match (&after, table) {
                (None, None) => JsValue::UNDEFINED,
                (Some(key), None) => web_sys::IdbKeyRange::lower_bound_with_open(key, true).map_err(|e| failed(crate::error::describe(&e)))?.into(),
                (after, Some(t)) => table_range(t, after.as_ref())?.into(),
            };
            let records: Vec<JsValue> = {
                let request = from.get_all::<JsValue>().with_limit(CHUNK);
                let request = if range.is_undefined() { request.primitive() } else { request.with_query(range).primitive() };
                request.map_err(failed)?.await.map_err(failed)?.map(|r| r.map_err(failed)).collect::<Result<_, _>>()?
            };
            let Some(last) = records.last() else { return Ok(()) };
            let last: RowRecord = from_js(last.clone())?;
            for record in &records {
                let row: RowRecord = from_js(record.clone())?;
                drop(to.put(self.encode_row(&row)?).with_key(row_key(&row.table, &row.pk)).primitive().map_err(failed)?);
            }
            if (records.len() as u32) < CHUNK {
                return Ok(());
            }
            after = Some(row_key(&last.table, &last.pk));
        }
    }

    /// Moves every row of `table` held in `chunks` into `rows`, as its own record with this
    /// store's tokens, and deletes the table's chunks: about `CHUNK` rows at a time, as `rewrite`.
    async fn unchunk_table(&self, chunks: &ObjectStore<'_>, rows: &ObjectStore<'_>, table: &str) -> Result<(), ClientError> {
        let range = JsValue::from(table_range(table, None)?);
        let per_read = (CHUNK as usize / crate::chunks::CHUNK_ROWS).max(1) as u32;
        loop {
            let found: Vec<JsValue> = chunks.get_all::<JsValue>().with_query(range.clone()).with_limit(per_read).primitive().map_err(failed)?
                .await.map_err(failed)?.map(|c| c.map_err(failed)).collect::<Result<_, _>>()?;
            for chunk in &found {
                for record in crate::chunks::records(chunk)?.iter() {
                    let row: RowRecord = from_js(record)?;
                    drop(rows.put(self.encode_row(&row)?).with_key(row_key(&row.table, &row.pk)).primitive().map_err(failed)?);
                }
                drop(chunks.delete(js_sys::Reflect::get(chunk, &"id".into()).map_err(|e| failed(crate::error::describe(&e)))?).primitive().map_err(failed)?);
            }
            if (found.len() as u32) < per_read {
                return Ok(());
            }
        }
    }

    /// A row as stored: its record, with the tokens of its table's declared indexes.
    fn encode_row(&self, row: &RowRecord) -> Result<JsValue, ClientError> {
        let js = to_js(row)?;
        self.set_tokens(&js, row)?;
        Ok(js)
    }

    /// Gives a stored record `js` the tokens of its table's declared indexes, from `record`.
    fn set_tokens(&self, js: &JsValue, record: &RowRecord) -> Result<(), ClientError> {
        if let Some(tokens) = crate::indexes::tokens(&self.indexes.borrow(), record) {
            let _ = js_sys::Reflect::set(js, &"eq".into(), &to_js(&tokens)?);
        }
        Ok(())
    }

    /// Gives the stored record `js` of a row the server delivered (its JSON text `row`) the tokens
    /// of its table's declared indexes (`indexes::server_row_tokens`).
    fn set_server_row_tokens(&self, js: &JsValue, table: &str, row: &str) -> Result<(), ClientError> {
        let tokens = crate::indexes::server_row_tokens(&self.indexes.borrow(), table, row).map_err(|e| ClientError::new("STORAGE_CORRUPT", e))?;
        if let Some(tokens) = tokens {
            let _ = js_sys::Reflect::set(js, &"eq".into(), &to_js(&tokens)?);
        }
        Ok(())
    }

    /// The stored records whose `index` field ("bucket" or "eq") equals `value`, as the
    /// browser read them: for a read that hands rows straight back to the app, no row is copied
    /// into wasm memory (which never shrinks), so a query over a million rows costs the JS heap
    /// what the app keeps, and nothing after.
    /// `each` sees every record, one at a time.
    /// Records in chunks come in the same order, by table and key, among the others.
    pub async fn records_where(&self, index: &str, value: &str, each: impl FnMut(&JsValue)) -> Result<(), ClientError> {
        let tx = self.transaction(TransactionMode::Readonly)?;
        let found = read_index(&store(&tx, ROWS)?, index, value)?;
        // Only the `bucket` index has a counterpart in the chunks (no chunked table declares `eq`).
        let chunked = (index == "bucket").then(|| read_index(&store(&tx, CHUNKS)?, "bucket", value)).transpose()?;
        let value = JsValue::from_str(value);
        let in_chunks = |chunk: &JsValue| Ok(crate::chunks::records(chunk)?.filter(&mut |r, _, _| js_sys::Reflect::get(&r, &"bucket".into()).ok().as_ref() == Some(&value)));
        merge_chunked(found.await.map_err(failed)?, chunked, in_chunks, each).await
    }

    /// The stored records of `keys` that exist, as the browser read them.
    pub async fn records(&self, keys: &[RowKey]) -> Result<Vec<JsValue>, ClientError> {
        let tx = self.transaction(TransactionMode::Readonly)?;
        let (rows, chunks) = (store(&tx, ROWS)?, store(&tx, CHUNKS)?);
        let requests = request_rows(&rows, keys)?;
        let in_chunks = keys.iter().map(|key| crate::chunks::request_chunk(&chunks, key)).collect::<Result<Vec<_>, _>>()?;
        let (mut found, mut parsed) = (Vec::new(), crate::chunks::ParsedChunks::default());
        for ((request, chunk), key) in requests.into_iter().zip(in_chunks).zip(keys) {
            let own = present(request.await.map_err(failed)?);
            let chunk = present(chunk.await.map_err(failed)?);
            found.extend(match (own, chunk) {
                (Some(own), _) => Some(own),
                (None, Some(chunk)) => parsed.record_of(&chunk, &key.pk)?,
                (None, None) => None,
            });
        }
        Ok(found)
    }

    /// Takes the database's declared indexes from the `sync` record as read in a transaction
    /// (absent: none declared).
    fn follow_declaration(&self, record: Option<&JsValue>) -> Result<(), ClientError> {
        *self.indexes.borrow_mut() = record.and_then(|r| sync_field(r, "indexes")).map(from_js).transpose()?.unwrap_or_default();
        *self.chunked.borrow_mut() = chunked_tables(record);
        Ok(())
    }

    /// The records of `table`'s rows, as the browser read them (see `records_where`): through the
    /// database's declared index of the first condition of `conditions` it has one for, else all
    /// of the table's. The declaration is read in the same transaction, beside the read through
    /// the index this tab last knew of, which is used when it still stands.
    pub async fn table_records(&self, table: &str, conditions: &serde_json::Map<String, serde_json::Value>, each: impl FnMut(&JsValue)) -> Result<(), ClientError> {
        let tx = self.transaction(TransactionMode::Readonly)?;
        let rows = store(&tx, ROWS)?;
        let declared = store(&tx, META)?.get(JsValue::from_str(SYNC_KEY)).primitive().map_err(failed)?;
        // Through the declared index of a condition, else the table's key range.
        let read = |token: &Option<String>| match token {
            Some(token) => read_index(&rows, "eq", token),
            None => read_table(&rows, table),
        };
        let known = crate::indexes::lookup(&self.indexes.borrow(), table, conditions);
        let guessed = read(&known)?;
        // A table read whole may have rows in chunks (one read through a declared index has none).
        let chunks = store(&tx, CHUNKS)?;
        let chunked = |token: &Option<String>| token.is_none().then(|| read_table(&chunks, table)).transpose();
        let guessed_chunks = chunked(&known)?;
        self.follow_declaration(present(declared.await.map_err(failed)?).as_ref())?;
        let stands = crate::indexes::lookup(&self.indexes.borrow(), table, conditions);
        let (found, in_chunks) = if stands == known { (guessed, guessed_chunks) } else { (read(&stands)?, chunked(&stands)?) };
        merge_chunked(found.await.map_err(failed)?, in_chunks, crate::chunks::records, each).await
    }

    pub fn close(&self) {
        self.db.clone().close();
    }

    /// Runs `then` once no step's transaction is open: at once when none is, else when the last
    /// one ends. After `close` no new one can open, so from then on the engine is nobody's.
    pub fn when_idle(&self, then: Box<dyn FnOnce()>) {
        if self.open_steps.get() == 0 {
            then();
        } else {
            *self.idle.borrow_mut() = Some(then);
        }
    }

    fn transaction(&self, mode: TransactionMode) -> Result<Transaction<'_>, ClientError> {
        self.transaction_over(ALL.to_vec(), mode)
    }

    /// The engine's persisted state (`None` for a database that never held one) and the stamp it
    /// is as of.
    pub async fn load(&self) -> Result<(Option<PersistedState>, SyncStamp), ClientError> {
        let tx = self.transaction(TransactionMode::Readonly)?;
        let record = get(&store(&tx, META)?, SYNC_KEY.into()).await?;
        *self.chunked.borrow_mut() = chunked_tables(record.as_ref());
        Ok((load_state(&tx, record.as_ref()).await?, stamp_of(record.as_ref())?))
    }

    /// Begins a read-write transaction over every store. It resolves once the transaction is
    /// running, that is after every transaction created before it has finished, so an engine step
    /// taken now sees the store in the state the engine's earlier steps left it.
    pub async fn begin(&self) -> Result<WriteTxn<'_>, ClientError> {
        self.begin_reading(&[]).await.map(|(txn, _)| txn)
    }

    /// `begin`, with the stored records of `keys` read in the same round trip as the `sync` stamp:
    /// every request is issued before the first answer is awaited.
    pub async fn begin_reading(&self, keys: &[RowKey]) -> Result<(WriteTxn<'_>, BTreeMap<RowKey, RowRecord>), ClientError> {
        let open = OpenStep::new(self);
        let tx = self.transaction(TransactionMode::Readwrite)?;
        let step = StepReads::issue(self, &tx)?;
        let rows = RowReads::issue(store(&tx, ROWS)?, store(&tx, CHUNKS)?, keys, Some(&self.chunked.borrow()))?;
        let (found, _) = step.answered(self).await?;
        let chunked = self.chunked.borrow().clone();
        let rows = rows.found(Some(&chunked)).await?;
        let mut txn = WriteTxn::new(self, tx, open);
        txn.found(found)?;
        Ok((txn, rows))
    }

    /// Whether a step's transaction is open: its step may yet fail and be rolled back, so a step
    /// taken on the engine as it stands (`WriteTxn::issue_reads`) would build on it.
    pub fn busy(&self) -> bool {
        self.open_steps.get() > 0
    }

    /// Begins a read-write transaction over every store without reading anything: its reads are
    /// issued with `WriteTxn::issue_reads` and answered after the step's puts are queued. Its
    /// `stamp` is the default until those answers set it.
    pub fn begin_unread(&self) -> Result<WriteTxn<'_>, ClientError> {
        let open = OpenStep::new(self);
        let tx = self.transaction(TransactionMode::Readwrite)?;
        Ok(WriteTxn::new(self, tx, open))
    }

    /// The stored records of `keys` that exist, read in one transaction.
    pub async fn rows(&self, keys: &[RowKey]) -> Result<BTreeMap<RowKey, RowRecord>, ClientError> {
        let tx = self.transaction(TransactionMode::Readonly)?;
        RowReads::issue(store(&tx, ROWS)?, store(&tx, CHUNKS)?, keys, None)?.found(None).await
    }

    /// Drops the record `put_unheard` wrote under `suffix`: its events were told.
    pub async fn forget_unheard(&self, suffix: &str) -> Result<(), ClientError> {
        let tx = self.transaction_over(vec![META], TransactionMode::Readwrite)?;
        drop(store(&tx, META)?.delete(JsValue::from_str(&format!("{UNHEARD}{suffix}"))).primitive().map_err(failed)?);
        tx.commit().await.map_err(failed)
    }
}

/// A running read-write transaction over every store. Dropped without `commit`, it is rolled
/// back, so a step that fails half-way writes nothing.
pub struct WriteTxn<'a> {
    store: &'a Store,
    tx: Transaction<'a>,
    /// The stamp of the `sync` record as this transaction found it.
    pub stamp: SyncStamp,
    /// The `sync` record as this transaction found it (`None`: there was none, or its read is not
    /// answered yet): what a put of the record does not change is put back as it was read.
    found: Option<JsValue>,
    /// The engine's `meta` record as the step's last `PutMeta` gave it.
    meta: std::cell::RefCell<Option<JsValue>>,
    /// The stamp the `sync` record is put with as the transaction commits (`put_stamp`).
    new_stamp: std::cell::RefCell<Option<SyncStamp>>,
    /// Its changes to the pages staged in memory, carried out when it commits.
    staging: std::cell::RefCell<Vec<StagingChange>>,
    /// The keys it writes as records of their own, to be taken out of their chunks as it commits.
    unchunking: std::cell::RefCell<Unchunking>,
    /// The tables that may have rows in chunks once it commits, when it changed them (`None`: as found).
    chunked: std::cell::RefCell<Option<std::collections::BTreeSet<String>>>,
    /// The number of its next chunk (`chunks::put`).
    next_chunk: std::cell::Cell<u32>,
    /// Keys written alone before its `sync` record was answered (a write queued behind its reads,
    /// `issue_reads`) whose tables were not known to have chunks then: looked up once it is, if
    /// the record says they have.
    unverified: std::cell::RefCell<Vec<RowKey>>,
    /// Whether its `sync` record was answered (`found`).
    answered: std::cell::Cell<bool>,
    /// Counts it open until it has committed or been dropped (after `tx`, which it outlives).
    _open: OpenStep<'a>,
}

/// What every step reads first, issued and not yet answered: the `sync` record, with the
/// declaration of indexes this tab knew when it was issued.
struct StepReads {
    record: RowRequest,
    known: Indexes,
}

impl StepReads {
    fn issue(db: &Store, tx: &Transaction<'_>) -> Result<StepReads, ClientError> {
        let record = store(tx, META)?.get::<JsValue, _, _>(JsValue::from_str(SYNC_KEY)).primitive().map_err(failed)?;
        Ok(StepReads { record, known: db.indexes.borrow().clone() })
    }

    /// The record, and whether its declaration differs from the one known at `issue`; the
    /// declaration read becomes the store's.
    async fn answered(self, store: &Store) -> Result<(Option<JsValue>, bool), ClientError> {
        let record = present(self.record.await.map_err(failed)?);
        store.follow_declaration(record.as_ref())?;
        let changed = *store.indexes.borrow() != self.known;
        Ok((record, changed))
    }
}

/// The reads `WriteTxn::issue_reads` issued, not yet answered.
pub struct UnreadAnswers<'t> {
    /// With the declaration known when they were issued: the tokens of the step's rows, queued
    /// right after, are made for it.
    step: StepReads,
    rows: RowReads<'t>,
}

/// What `UnreadAnswers::answered` found.
pub struct Answered {
    /// The `sync` record (`WriteTxn::found`).
    pub record: Option<JsValue>,
    /// The database's declared indexes differ from those this tab wrote the step's rows' tokens for.
    pub indexes_changed: bool,
    /// The records of the keys that exist.
    pub found: BTreeMap<RowKey, RowRecord>,
}

impl UnreadAnswers<'_> {
    pub async fn answered(self, store: &Store) -> Result<Answered, ClientError> {
        let (record, indexes_changed) = self.step.answered(store).await?;
        let chunked = store.chunked.borrow().clone();
        Ok(Answered { record, indexes_changed, found: self.rows.found(Some(&chunked)).await? })
    }
}

/// A step's transaction, counted open in `Store::open_steps` from before it is created until it
/// ends; the last to end runs what `Store::when_idle` left.
struct OpenStep<'a>(&'a Store);

impl<'a> OpenStep<'a> {
    fn new(store: &'a Store) -> OpenStep<'a> {
        store.open_steps.set(store.open_steps.get() + 1);
        OpenStep(store)
    }
}

impl Drop for OpenStep<'_> {
    fn drop(&mut self) {
        let open = self.0.open_steps.get().saturating_sub(1);
        self.0.open_steps.set(open);
        if open == 0 {
            let then = self.0.idle.borrow_mut().take();
            if let Some(then) = then {
                then();
            }
        }
    }
}

impl<'a> WriteTxn<'a> {
    fn new(store: &'a Store, tx: Transaction<'a>, open: OpenStep<'a>) -> WriteTxn<'a> {
        WriteTxn {
            store,
            tx,
            stamp: SyncStamp::default(),
            found: None,
            meta: Default::default(),
            new_stamp: Default::default(),
            staging: Default::default(),
            unchunking: Default::default(),
            chunked: Default::default(),
            next_chunk: Default::default(),
            unverified: Default::default(),
            answered: Default::default(),
            _open: open,
        }
    }

    /// Takes the `sync` record as read (`Answered::record`): its stamp becomes `stamp`.
    pub fn found(&mut self, record: Option<JsValue>) -> Result<(), ClientError> {
        self.stamp = stamp_of(record.as_ref())?;
        let chunked = chunked_tables(record.as_ref());
        self.found = record;
        self.answered.set(true);
        let unverified = std::mem::take(&mut *self.unverified.borrow_mut());
        for key in unverified.iter().filter(|k| chunked.contains(&k.table)) {
            self.unchunking.borrow_mut().look_up(&store(&self.tx, CHUNKS)?, key)?;
        }
        Ok(())
    }

    /// The engine's persisted state as this transaction sees it (its `sync` record read).
    pub async fn load_state(&self) -> Result<Option<PersistedState>, ClientError> {
        load_state(&self.tx, self.found.as_ref()).await
    }

    /// Replaces the `sync` record's stamp with `stamp` when the transaction commits.
    pub fn put_stamp(&self, stamp: &SyncStamp) {
        *self.new_stamp.borrow_mut() = Some(stamp.clone());
    }

    /// Keeps the engine's `meta` record for the `sync` record's put (`PutMeta`).
    fn put_meta(&self, record: JsValue) {
        *self.meta.borrow_mut() = Some(record);
    }

    /// Puts the `sync` record once, as the transaction commits, when the step gave it a stamp or a
    /// meta: the stamp given, else the one found; the meta of the step's last `PutMeta`, else the
    /// one found; the declaration of indexes found. Its read is answered by then, also for a write
    /// that queued its puts before it (`issue_reads`).
    fn put_sync_record(&self) -> Result<(), ClientError> {
        let meta = self.meta.borrow().clone();
        let Some(stamp) = self.new_stamp.borrow().clone().or_else(|| meta.is_some().then(|| self.stamp.clone())) else { return Ok(()) };
        let read = |name| self.found.as_ref().and_then(|r| sync_field(r, name));
        let chunked = match self.chunked.borrow().as_ref() {
            Some(tables) => (!tables.is_empty()).then(|| to_js(tables)).transpose()?,
            None => read("chunked"),
        };
        let record = sync_record(&stamp, meta.or_else(|| read("meta")).as_ref(), read("indexes").as_ref(), chunked.as_ref());
        drop(store(&self.tx, META)?.put(record).with_key(JsValue::from_str(SYNC_KEY)).primitive().map_err(failed)?);
        Ok(())
    }

    /// The stored records of `keys` that exist.
    pub async fn rows(&self, keys: &[RowKey]) -> Result<BTreeMap<RowKey, RowRecord>, ClientError> {
        let chunked = self.chunked_now();
        RowReads::issue(store(&self.tx, ROWS)?, store(&self.tx, CHUNKS)?, keys, Some(&chunked))?.found(Some(&chunked)).await
    }

    /// Issues what `Store::begin_reading` reads (the `sync` stamp, the declared indexes, the
    /// records of `keys`) without awaiting them: requests run in order, so these read the store as
    /// it was before the puts queued after them, which must be queued before anything is awaited
    /// (they carry the tokens of the indexes known now). Fewer than `RANGE_READ_MIN` keys of a
    /// table: more are read as a range first, whose second reads would come after those puts.
    pub fn issue_reads(&self, keys: &[RowKey]) -> Result<UnreadAnswers<'_>, ClientError> {
        let step = StepReads::issue(self.store, &self.tx)?;
        let rows = RowReads::issue(store(&self.tx, ROWS)?, store(&self.tx, CHUNKS)?, keys, Some(&self.store.chunked.borrow()))?;
        Ok(UnreadAnswers { step, rows })
    }

    /// Keeps `events` with the step that commits them, under `unheard:<suffix>`: a page that goes
    /// away while the step commits (a reload) would otherwise take them with it, though their
    /// writes have left the outbox. The tab drops the record once it has told them
    /// (`Store::forget_unheard`, with the same suffix); one that never could is told by the next
    /// client to open the database or the next tab to lead (`take_unheard`).
    pub fn put_unheard(&self, suffix: &str, events: Vec<Event>) -> Result<(), ClientError> {
        let text = crate::tabs::events_text(events).map_err(|e| ClientError::new("STORAGE_FAILED", format!("cannot encode events: {e}")))?;
        drop(store(&self.tx, META)?.put(JsValue::from_str(&text)).with_key(JsValue::from_str(&format!("{UNHEARD}{suffix}"))).primitive().map_err(failed)?);
        Ok(())
    }

    /// Every event `put_unheard` kept and nobody dropped, in commit order; they are deleted when
    /// this transaction commits, so one tab tells them.
    pub async fn take_unheard(&self) -> Result<Vec<Event>, ClientError> {
        take_unheard(&self.tx).await
    }

    /// Writes page `page_no` of the pull run in progress, as staged, into this transaction
    /// (`write_page`).
    pub async fn write_staged(&self, plan: &mut CommitPlan, page_no: u32) -> Result<(), ClientError> {
        let kept = self.store.staged.borrow().pages.get(page_no as usize).and_then(|page| page.as_ref().map(|(text, _)| text.clone()));
        let page = match kept {
            Some(page) => page,
            None => get(&store(&self.tx, STAGING)?, (page_no as f64).into()).await?.unwrap_or(JsValue::UNDEFINED),
        };
        let text = match page.as_string() {
            Some(text) => text,
            // Staged by an earlier version, as an object.
            None => js_sys::JSON::stringify(&page).map(String::from).unwrap_or_default(),
        };
        self.write_page(plan, &text)
    }

    /// Writes the entries of one page of the committing run, held as its text, into this
    /// transaction. Rows of keys no write of ours touches go as their text, in a record put
    /// together around it (`StagedEntry`): decoding each row into wasm memory and encoding it
    /// again was most of what a first sync's closing transaction spent in wasm. The others go
    /// through the plan.
    pub fn write_page(&self, plan: &mut CommitPlan, text: &str) -> Result<(), ClientError> {
        let corrupt = |e: serde_json::Error| ClientError::new("STORAGE_CORRUPT", format!("a staged page does not decode: {e}"));
        let staged: PageText<'_> = serde_json::from_str(text).map_err(corrupt)?;
        let rows = store(&self.tx, ROWS)?;
        let chunks = store(&self.tx, CHUNKS)?;
        // A run from `null` cleared every row and chunk first: its rows go into chunks, those of
        // its first page's snapshot (a key written while the run went on comes again, later, and
        // is stored as its own record, taking its earlier copy out of its chunk).
        let chunk_up_to = if plan.rehydrate() { plan.first_horizon() } else { None };
        let mut server_rows = ServerRows { chunk_up_to, ..ServerRows::default() };
        for StagedEntry { seq, table, pk, bucket, row, deleted } in staged.entries {
            match (plan.place(seq, &table, &pk, deleted), row) {
                (Placement::Skip, _) => {}
                (Placement::ServerRow, Some(row)) => {
                    server_rows.push(self, seq, table, pk, bucket, row.get())?;
                    if server_rows.full() {
                        server_rows.put(self, &rows, &chunks)?;
                    }
                }
                // A live entry without a row leaves nothing to show, as `materialize` has it.
                (Placement::ServerRow | Placement::Delete, _) => {
                    server_rows.put(self, &rows, &chunks)?;
                    drop(rows.delete(row_key(&table, &pk)).primitive().map_err(failed)?);
                    self.written_alone(&chunks, &RowKey::new(table.into_owned(), pk.into_owned()))?
                }
                (Placement::Replay, row) => {
                    server_rows.put(self, &rows, &chunks)?;
                    let row = row.map(|raw| staged_row(raw.get())).transpose()?;
                    let entry = Entry { seq, table: table.into_owned(), pk: pk.into_owned(), bucket: bucket.into_owned(), row, deleted };
                    if let Some(op) = plan.materialize(entry) {
                        self.apply(std::slice::from_ref(&op))?;
                    }
                }
            }
        }
        server_rows.put(self, &rows, &chunks)
    }

    /// Queues every operation; requests run in order, so a later put wins over an earlier one.
    pub fn apply(&self, ops: &[StoreOp]) -> Result<(), ClientError> {
        apply(self, ops)
    }

    /// The tables that may have rows in chunks, as this transaction leaves them.
    fn chunked_now(&self) -> std::collections::BTreeSet<String> {
        self.chunked.borrow().clone().unwrap_or_else(|| self.store.chunked.borrow().clone())
    }

    /// `key` is written as a record of its own (or deleted): out of its chunk, if its table has any.
    fn written_alone(&self, chunks: &ObjectStore<'_>, key: &RowKey) -> Result<(), ClientError> {
        let chunked = match self.chunked.borrow().as_ref() {
            Some(tables) => tables.contains(&key.table),
            None => self.store.chunked.borrow().contains(&key.table),
        };
        if chunked {
            self.unchunking.borrow_mut().look_up(chunks, key)?;
        } else if !self.answered.get() {
            self.unverified.borrow_mut().push(key.clone());
        }
        Ok(())
    }

    /// Every row and chunk is cleared (`ClearRows`).
    fn rows_cleared(&self) {
        *self.chunked.borrow_mut() = Some(Default::default());
        *self.unchunking.borrow_mut() = Unchunking::default();
        self.unverified.borrow_mut().clear();
    }

    /// Queues `rows` of `table` as chunks, and records that the table has some.
    fn put_chunks(&self, chunks: &ObjectStore<'_>, table: &str, rows: Vec<crate::chunks::ChunkRow<'_>>) -> Result<(), ClientError> {
        let mut next = self.next_chunk.get();
        crate::chunks::put(chunks, table, rows, &mut next)?;
        self.next_chunk.set(next);
        let mut tables = self.chunked_now();
        tables.insert(table.to_owned());
        *self.chunked.borrow_mut() = Some(tables);
        Ok(())
    }

    /// Stages a page's text in memory when it fits (after this transaction's own changes), and
    /// says whether it did.
    fn stage_in_memory(&self, page_no: u32, text: &str) -> bool {
        let mut staging = self.staging.borrow_mut();
        let bytes = staging.iter().fold(self.store.staged.borrow().bytes, |bytes, change| match change {
            StagingChange::Put(_, _, n) => bytes + n,
            StagingChange::Clear => 0,
        });
        if bytes + text.len() > self.store.staging_memory_bytes {
            return false;
        }
        staging.push(StagingChange::Put(page_no, JsValue::from_str(text), text.len()));
        true
    }

    /// Puts the `sync` record (`put_sync_record`) and resolves once everything queued is durable.
    pub async fn commit(self) -> Result<(), ClientError> {
        let unchunking = std::mem::take(&mut *self.unchunking.borrow_mut());
        unchunking.finish(&store(&self.tx, CHUNKS)?).await?;
        self.put_sync_record()?;
        self.tx.commit().await.map_err(failed)?;
        if let Some(tables) = self.chunked.into_inner() {
            *self.store.chunked.borrow_mut() = tables;
        }
        let mut staged = self.store.staged.borrow_mut();
        for change in self.staging.into_inner() {
            match change {
                StagingChange::Put(page_no, text, bytes) => {
                    staged.bytes += bytes;
                    let at = page_no as usize;
                    if staged.pages.len() <= at {
                        staged.pages.resize_with(at + 1, || None);
                    }
                    if let Some((_, replaced)) = staged.pages[at].replace((text, bytes)) {
                        staged.bytes -= replaced;
                    }
                }
                StagingChange::Clear => *staged = StagedInMemory::default(),
            }
        }
        Ok(())
    }

    pub fn abort(self) {
        drop(self.tx);
    }
}

/// `WriteTxn::take_unheard` in `tx`.
async fn take_unheard(tx: &Transaction<'_>) -> Result<Vec<Event>, ClientError> {
    let meta = store(tx, META)?;
    let range: JsValue = web_sys::IdbKeyRange::bound_with_lower_open_and_upper_open(&UNHEARD.into(), &PAST_UNHEARD.into(), false, true)
        .map_err(|e| failed(crate::error::describe(&e)))?
        .into();
    let records: Vec<JsValue> = meta.get_all::<JsValue>().with_query(range.clone()).primitive().map_err(failed)?.await.map_err(failed)?
        .map(|r| r.map_err(failed))
        .collect::<Result<_, _>>()?;
    let kept = !records.is_empty();
    let mut events = Vec::new();
    for record in records {
        let text = record.as_string().unwrap_or_default();
        let told = crate::tabs::events_of(&text).map_err(|e| ClientError::new("STORAGE_CORRUPT", format!("kept events do not decode: {e}")))?;
        events.extend(told);
    }
    if kept {
        drop(meta.delete(range).primitive().map_err(failed)?);
    }
    Ok(events)
}

/// The engine's persisted state in `tx`, whose `sync` record is `record`.
async fn load_state(tx: &Transaction<'_>, record: Option<&JsValue>) -> Result<Option<PersistedState>, ClientError> {
    let Some(meta) = record.and_then(|r| sync_field(r, "meta")) else { return Ok(None) };
    let outbox: Vec<_> = get_all(&store(tx, OUTBOX)?).await?.into_iter().map(from_js).collect::<Result<_, _>>()?;
    let dead: Vec<_> = get_all(&store(tx, DEAD)?).await?.into_iter().map(from_js).collect::<Result<_, _>>()?;
    // The rows of pending writes are read by the steps that need them (`Engine::remember`), not
    // here: a database with 10,000 pending writes spent half its open reading them one by one.
    Ok(Some(PersistedState { meta: from_js(meta)?, outbox, dead, rows: Vec::new() }))
}

pub(crate) type RowRequest = indexed_db_futures::future::BasicRequest<Option<JsValue>>;

/// Issues a get for each of `keys`, answered in order. Every request is issued before the first
/// answer is awaited: IndexedDB runs them back to back, where awaiting each in turn cost a round
/// trip per key.
pub(crate) fn request_rows(rows: &ObjectStore<'_>, keys: &[RowKey]) -> Result<Vec<RowRequest>, ClientError> {
    keys.iter().map(|key| rows.get::<JsValue, _, _>(row_key(&key.table, &key.pk)).primitive().map_err(failed)).collect()
}

fn store<'a>(tx: &'a Transaction<'_>, name: &str) -> Result<ObjectStore<'a>, ClientError> {
    tx.object_store(name).map_err(failed)
}

/// The record at `key`, or `None`.
async fn get(store: &ObjectStore<'_>, key: JsValue) -> Result<Option<JsValue>, ClientError> {
    Ok(present(store.get(key).primitive().map_err(failed)?.await.map_err(failed)?))
}

/// A record read back, unless there was none.
pub(crate) fn present(found: Option<JsValue>) -> Option<JsValue> {
    found.filter(|v| !v.is_undefined() && !v.is_null())
}

async fn get_all(store: &ObjectStore<'_>) -> Result<Vec<JsValue>, ClientError> {
    let all = store.get_all::<JsValue>().primitive().map_err(failed)?.await.map_err(failed)?;
    all.map(|r| r.map_err(failed)).collect()
}

/// Stages a pull page's text: in memory while it fits (`StagedInMemory`), else in IndexedDB. As
/// text: nothing reads a staged page but the commit, and a string is cloned into IndexedDB in one
/// copy where a page of objects is walked entry by entry.
fn stage(txn: &WriteTxn<'_>, page_no: u32, text: &str) -> Result<(), ClientError> {
    if !txn.stage_in_memory(page_no, text) {
        drop(store(&txn.tx, STAGING)?.put(JsValue::from_str(text)).with_key(JsValue::from_f64(page_no as f64)).primitive().map_err(failed)?)
    }
    Ok(())
}

/// The records of rows a page delivers that no write of ours touches, `{table, pk, bucket, base}`
/// (`visible` absent: it is `base`) as `encode_row` would store them, gathered as the text of one
/// JSON array around the rows' own text, each followed by its key, and made into JS objects by one
/// `JSON.parse`: built and parsed one row at a time, a first sync of 100,000 rows made 100,000 of
/// those calls. A page's other requests put the rows gathered so far first (`put`), so the store
/// sees every request of the page in the page's order.
#[derive(Default)]
struct ServerRows<'p> {
    text: Vec<u8>,
    rows: Vec<(Cow<'p, str>, Cow<'p, str>, &'p str)>,
    /// The rows of tables that declare no index go into chunks (`chunks.rs`), when at or below this
    /// horizon: a run from `null`'s first snapshot (`CommitPlan::first_horizon`).
    chunk_up_to: Option<i64>,
    /// Those rows, by table, and their bytes.
    chunked: Vec<(Cow<'p, str>, Vec<crate::chunks::ChunkRow<'p>>)>,
    chunked_bytes: usize,
}

/// The most text `ServerRows` gathers before putting what it holds (wasm memory never shrinks).
const SERVER_ROWS_BYTES: usize = 256 << 10;

impl<'p> ServerRows<'p> {
    fn push(&mut self, txn: &WriteTxn<'_>, seq: i64, table: Cow<'p, str>, pk: Cow<'p, str>, bucket: Cow<'p, str>, row: &'p str) -> Result<(), ClientError> {
        if self.chunk_up_to.is_some_and(|h| seq <= h) && !txn.store.indexes.borrow().contains_key(table.as_ref()) {
            self.chunked_bytes += row.len() + pk.len() + bucket.len();
            let chunk_row = crate::chunks::ChunkRow { pk, bucket, row };
            match self.chunked.iter_mut().find(|(t, _)| *t == table) {
                Some((_, rows)) => rows.push(chunk_row),
                None => self.chunked.push((table, vec![chunk_row])),
            }
            return Ok(());
        }
        let encode = |e: serde_json::Error| ClientError::new("STORAGE_FAILED", format!("cannot encode a record: {e}"));
        self.text.extend_from_slice(if self.rows.is_empty() { b"[{\"table\":" } else { b",{\"table\":" });
        serde_json::to_writer(&mut self.text, table.as_ref()).map_err(encode)?;
        self.text.extend_from_slice(b",\"pk\":");
        serde_json::to_writer(&mut self.text, pk.as_ref()).map_err(encode)?;
        self.text.extend_from_slice(b",\"bucket\":");
        serde_json::to_writer(&mut self.text, bucket.as_ref()).map_err(encode)?;
        self.text.extend_from_slice(b",\"base\":");
        self.text.extend_from_slice(row.as_bytes());
        self.text.extend_from_slice(b"},");
        write_row_key(&mut self.text, &table, &pk).map_err(encode)?;
        self.rows.push((table, pk, row));
        Ok(())
    }

    fn full(&self) -> bool {
        self.text.len() + self.chunked_bytes >= SERVER_ROWS_BYTES
    }

    /// Queues the puts of the records gathered so far, in the order they came; the chunked ones
    /// as chunks, each table's apart (each key once: see `chunk_up_to`). The chunks go first, so
    /// that a later copy of a key among the others finds its chunk to take it out of.
    fn put(&mut self, txn: &WriteTxn<'_>, rows: &ObjectStore<'_>, chunks: &ObjectStore<'_>) -> Result<(), ClientError> {
        for (table, chunked) in std::mem::take(&mut self.chunked) {
            txn.put_chunks(chunks, &table, chunked)?;
        }
        self.chunked_bytes = 0;
        if self.rows.is_empty() {
            return Ok(());
        }
        self.text.push(b']');
        let corrupt = || ClientError::new("STORAGE_CORRUPT", "a staged row is not JSON");
        let text = std::str::from_utf8(&self.text).map_err(|_| corrupt())?;
        let records: Array = js_sys::JSON::parse(text).map_err(|_| corrupt())?.unchecked_into();
        // Each record is followed by its key (`write_row_key`).
        for (i, (table, pk, row)) in self.rows.drain(..).enumerate() {
            let record = records.get(2 * i as u32);
            txn.store.set_server_row_tokens(&record, &table, row)?;
            drop(rows.put(record).with_key(records.get(2 * i as u32 + 1)).primitive().map_err(failed)?);
            txn.written_alone(chunks, &RowKey::new(table.into_owned(), pk.into_owned()))?;
        }
        self.text.clear();
        Ok(())
    }
}

/// Queues every operation on `tx` without waiting for each: IndexedDB runs a transaction's
/// requests in order, so a later put wins over an earlier one, and any failure aborts the
/// transaction, which `commit` then reports.
///
/// The records the step puts cross into JS together, as one JSON array parsed in one call
/// (`StepRecords`): a record at a time, every put paid a string's crossing and a `JSON.parse` call
/// of its own, twice per write in a batch.
///
/// Outbox entries deleted one after another with consecutive `seq`s (a slice's answer deletes its
/// entries in order) go as one range delete: in raw IndexedDB in Chromium, a transaction of 64
/// puts and 64 single deletes took 12 – 18 ms, the same with one range delete 6 – 7 ms. A range
/// `lo..=hi` of integer keys holds exactly those `seq`s. A run is issued before any other outbox
/// operation that follows it, so the outbox sees its requests in the engine's order; the other
/// stores are independent of it within the transaction.
fn apply(txn: &WriteTxn<'_>, ops: &[StoreOp]) -> Result<(), ClientError> {
    let db = txn.store;
    let mut records = StepRecords::encode(ops)?;
    let mut stores = OpenStores::new(&txn.tx);
    let seq = |n: i64| JsValue::from_f64(n as f64);
    let mut deleting: Option<(i64, i64)> = None;
    let delete_run = |stores: &mut OpenStores<'_, '_>, run: &mut Option<(i64, i64)>| -> Result<(), ClientError> {
        let Some((lo, hi)) = run.take() else { return Ok(()) };
        let keys: JsValue = if lo == hi {
            seq(lo)
        } else {
            web_sys::IdbKeyRange::bound(&seq(lo), &seq(hi)).map_err(|e| failed(crate::error::describe(&e)))?.into()
        };
        drop(stores.get(OUTBOX)?.delete(keys).primitive().map_err(failed)?);
        Ok(())
    };
    for op in ops {
        match op {
            StoreOp::PutRow(row) => {
                let record = records.next();
                db.set_tokens(&record, row)?;
                drop(stores.get(ROWS)?.put(record).with_key(records.next()).primitive().map_err(failed)?);
                txn.written_alone(stores.get(CHUNKS)?, &RowKey::new(row.table.clone(), row.pk.clone()))?
            }
            StoreOp::DeleteRow(key) => {
                drop(stores.get(ROWS)?.delete(records.next()).primitive().map_err(failed)?);
                txn.written_alone(stores.get(CHUNKS)?, key)?
            }
            StoreOp::PutOutbox(entry) => {
                delete_run(&mut stores, &mut deleting)?;
                drop(stores.get(OUTBOX)?.put(records.next()).with_key(seq(entry.seq)).primitive().map_err(failed)?)
            }
            StoreOp::DeleteOutbox(n) => {
                deleting = match deleting {
                    Some((lo, hi)) if hi.checked_add(1) == Some(*n) => Some((lo, *n)),
                    _ => {
                        delete_run(&mut stores, &mut deleting)?;
                        Some((*n, *n))
                    }
                };
            }
            StoreOp::PutDead(dead) => drop(stores.get(DEAD)?.put(records.next()).with_key(seq(dead.entry.seq)).primitive().map_err(failed)?),
            StoreOp::DeleteDead(n) => drop(stores.get(DEAD)?.delete(seq(*n)).primitive().map_err(failed)?),
            StoreOp::PutMeta(_) => txn.put_meta(records.next()),
            StoreOp::PutStaging { page_no, page } => {
                let text = serde_json::to_string(page).map_err(|e| ClientError::new("STORAGE_FAILED", format!("cannot encode a page: {e}")))?;
                stage(txn, *page_no, &text)?
            }
            StoreOp::PutStagingText { page_no, text } => stage(txn, *page_no, text)?,
            StoreOp::ClearStaging => {
                txn.staging.borrow_mut().push(StagingChange::Clear);
                drop(stores.get(STAGING)?.clear().map_err(failed)?)
            }
            StoreOp::ClearRows => {
                drop(stores.get(ROWS)?.clear().map_err(failed)?);
                drop(stores.get(CHUNKS)?.clear().map_err(failed)?);
                txn.rows_cleared()
            }
        }
    }
    delete_run(&mut stores, &mut deleting)
}

/// The object stores of one transaction, each asked for once: `IDBTransaction.objectStore()` is a
/// call into JS that decodes the store's name there, and a batch of 1,000 writes asked 2,000 times.
struct OpenStores<'t, 'a> {
    tx: &'t Transaction<'a>,
    open: Vec<(&'static str, ObjectStore<'t>)>,
}

impl<'t, 'a> OpenStores<'t, 'a> {
    fn new(tx: &'t Transaction<'a>) -> OpenStores<'t, 'a> {
        OpenStores { tx, open: Vec::with_capacity(ALL.len()) }
    }

    fn get(&mut self, name: &'static str) -> Result<&ObjectStore<'t>, ClientError> {
        let i = match self.open.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                self.open.push((name, store(self.tx, name)?));
                self.open.len() - 1
            }
        };
        Ok(&self.open[i].1)
    }
}

/// The records of a step's puts (`PutRow`, `PutOutbox`, `PutDead`, `PutMeta`), in the order of its
/// ops, as JS objects made by one `JSON.parse` of one array, each `PutRow`'s followed by its key, as
/// is each `DeleteRow`'s key (a key made apart is a call into JS for the array and a string crossing
/// for each of its two parts: in a CPU profile of `batch()`, `Array.of` and decoding the table's
/// name were as much as serializing the records). `apply` takes one for each of exactly these ops,
/// in the same order: the matches in `apply` and `encode`, and the estimate that sizes the text,
/// must name the same ops.
struct StepRecords {
    parsed: Array,
    taken: u32,
}

impl StepRecords {
    fn encode(ops: &[StoreOp]) -> Result<StepRecords, ClientError> {
        // About a record's size for each op that puts one, and its key's for each that names one
        // (up to 1 MiB), so that a batch's text is not copied into a buffer twice as large as it
        // grows: with the keys not counted, the bench page's wasm memory after its batches of
        // 1,000 went from 5.4 to 6.4 MB. A step of many outbox deletes asks for nothing.
        let size = |op: &StoreOp| match op {
            StoreOp::PutRow(row) => 256 + row.table.len() + row.pk.len() + 8,
            StoreOp::DeleteRow(key) => key.table.len() + key.pk.len() + 8,
            StoreOp::PutOutbox(_) | StoreOp::PutDead(_) | StoreOp::PutMeta(_) => 256,
            _ => 0,
        };
        let mut text = Vec::with_capacity(ops.iter().map(size).sum::<usize>().min(1 << 20) + 2);
        text.push(b'[');
        for op in ops {
            let written = match op {
                StoreOp::PutRow(row) => serde_json::to_writer(&mut text, row).and_then(|()| {
                    text.push(b',');
                    write_row_key(&mut text, &row.table, &row.pk)
                }),
                StoreOp::DeleteRow(key) => write_row_key(&mut text, &key.table, &key.pk),
                StoreOp::PutOutbox(entry) => serde_json::to_writer(&mut text, entry),
                StoreOp::PutDead(dead) => serde_json::to_writer(&mut text, dead),
                StoreOp::PutMeta(meta) => serde_json::to_writer(&mut text, meta),
                _ => continue,
            };
            written.map_err(|e| ClientError::new("STORAGE_FAILED", format!("cannot encode a record: {e}")))?;
            text.push(b',');
        }
        if text.len() > 1 {
            text.pop();
        }
        text.push(b']');
        // serde_json writes UTF-8 only.
        let text = String::from_utf8(text).map_err(|e| ClientError::new("STORAGE_FAILED", e.to_string()))?;
        let parsed = js_sys::JSON::parse(&text).map_err(|_| ClientError::new("STORAGE_FAILED", "JSON.parse refused the encoded records"))?;
        Ok(StepRecords { parsed: parsed.unchecked_into(), taken: 0 })
    }

    /// The next record (or key), in the order `encode` wrote them.
    fn next(&mut self) -> JsValue {
        self.taken += 1;
        self.parsed.get(self.taken - 1)
    }
}

/// Issues a read of the records of `rows` whose `index` field ("bucket" or "eq") equals `value`.
fn read_index(rows: &ObjectStore<'_>, index: &str, value: &str) -> Result<GetAllPrimitiveRequest<JsValue>, ClientError> {
    rows.index(index).map_err(failed)?.get_all::<JsValue>().with_query(JsValue::from_str(value)).primitive().map_err(failed)
}

/// Hands `each` the records `found` (read in key order), and, when `chunks` was read, the records
/// `of` each chunk it found (in key order, as stored), all in the order the `rows` store would give
/// them (`chunks::merge`).
async fn merge_chunked(
    found: impl Iterator<Item = indexed_db_futures::Result<JsValue>>,
    chunks: Option<GetAllPrimitiveRequest<JsValue>>,
    of: impl Fn(&JsValue) -> Result<Array, ClientError>,
    mut each: impl FnMut(&JsValue),
) -> Result<(), ClientError> {
    let mut sources: Vec<Array> = Vec::new();
    if let Some(chunks) = chunks {
        for chunk in chunks.await.map_err(failed)? {
            let records = of(&chunk.map_err(failed)?)?;
            if records.length() > 0 {
                sources.push(records);
            }
        }
    }
    if sources.is_empty() {
        for record in found {
            each(&record.map_err(failed)?);
        }
        return Ok(());
    }
    let own = Array::new();
    for record in found {
        own.push(&record.map_err(failed)?);
    }
    sources.push(own);
    crate::chunks::merge(&sources, each);
    Ok(())
}

/// Issues a read of the records of `table`'s rows, in primary-key order.
fn read_table(rows: &ObjectStore<'_>, table: &str) -> Result<GetAllPrimitiveRequest<JsValue>, ClientError> {
    rows.get_all::<JsValue>().with_query(JsValue::from(table_range(table, None)?)).primitive().map_err(failed)
}
