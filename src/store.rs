//! Kizuna's IndexedDB layout and the one way engine steps reach it.
//!
//! Every engine step that changes state runs inside a read-write transaction over all stores
//! (`Store::begin`): IndexedDB runs such transactions one at a time in the order they were created,
//! so the engine's order of steps and the store's order of commits are the same order.

use std::collections::BTreeMap;

use js_sys::Array;
use kizuna_engine::{PersistedState, RowKey, RowRecord, StoreOp};
use kizuna_protocol::PullPage;
use serde::{de::DeserializeOwned, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{IdbDatabase, IdbIndexParameters, IdbObjectStore, IdbTransaction, IdbTransactionMode};

use crate::error::ClientError;
use crate::idb;
use crate::js;

const ROWS: &str = "rows";
const OUTBOX: &str = "outbox";
const DEAD: &str = "dead";
const STAGING: &str = "staging";
const META: &str = "meta";
const ALL: [&str; 5] = [ROWS, OUTBOX, DEAD, STAGING, META];
const META_KEY: &str = "meta";
const SCHEMA_VERSION: u32 = 1;

pub struct Store {
    db: IdbDatabase,
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, ClientError> {
    js::encode(value).map_err(|e| ClientError::new("STORAGE_FAILED", format!("cannot encode a record: {e}")))
}

fn from_js<T: DeserializeOwned>(value: JsValue) -> Result<T, ClientError> {
    serde_wasm_bindgen::from_value(value)
        .map_err(|e| ClientError::new("STORAGE_CORRUPT", format!("a stored record does not decode: {e}")))
}

fn row_key(table: &str, pk: &str) -> JsValue {
    Array::of2(&table.into(), &pk.into()).into()
}

fn upgrade(db: &IdbDatabase, old_version: u32) -> Result<(), JsValue> {
    if old_version < 1 {
        let rows = db.create_object_store(ROWS)?;
        let params = IdbIndexParameters::new();
        params.set_unique(false);
        rows.create_index_with_str_and_optional_parameters("table", "table", &params)?;
        rows.create_index_with_str_and_optional_parameters("bucket", "bucket", &params)?;
        for name in [OUTBOX, DEAD, STAGING, META] {
            db.create_object_store(name)?;
        }
    }
    Ok(())
}

impl Store {
    pub async fn open(name: &str) -> Result<Store, ClientError> {
        let db = idb::open(name, SCHEMA_VERSION, upgrade).await?;
        Ok(Store { db })
    }

    pub fn close(&self) {
        self.db.close();
    }

    fn transaction(&self, mode: IdbTransactionMode) -> Result<IdbTransaction, ClientError> {
        let names: Array = ALL.iter().map(|n| JsValue::from_str(n)).collect();
        self.db.transaction_with_str_sequence_and_mode(&names, mode).map_err(ClientError::storage)
    }

    /// The engine's persisted state, or `None` for a database that never held one.
    pub async fn load(&self) -> Result<Option<PersistedState>, ClientError> {
        let tx = self.transaction(IdbTransactionMode::Readonly)?;
        let meta = get(&store(&tx, META)?, &META_KEY.into()).await?;
        if meta.is_undefined() || meta.is_null() {
            return Ok(None);
        }
        let outbox: Vec<_> = get_all(&store(&tx, OUTBOX)?).await?.into_iter().map(from_js).collect::<Result<_, _>>()?;
        let dead: Vec<_> = get_all(&store(&tx, DEAD)?).await?.into_iter().map(from_js).collect::<Result<_, _>>()?;
        let keys: Vec<RowKey> = PersistedState::tracked_keys(&outbox, &dead).into_iter().collect();
        let rows = read_rows(&store(&tx, ROWS)?, &keys).await?.into_values().collect();
        Ok(Some(PersistedState { meta: from_js(meta)?, outbox, dead, rows }))
    }

    /// Begins a read-write transaction over every store. It resolves once the transaction is
    /// running, that is after every transaction created before it has finished, so an engine step
    /// taken now sees the store in the state the engine's earlier steps left it.
    pub async fn begin(&self) -> Result<WriteTxn, ClientError> {
        let tx = self.transaction(IdbTransactionMode::Readwrite)?;
        let _ = get(&store(&tx, META)?, &META_KEY.into()).await?;
        Ok(WriteTxn { tx })
    }

    pub async fn get_row(&self, table: &str, pk: &str) -> Result<Option<RowRecord>, ClientError> {
        let tx = self.transaction(IdbTransactionMode::Readonly)?;
        let found = get(&store(&tx, ROWS)?, &row_key(table, pk)).await?;
        if found.is_undefined() || found.is_null() {
            return Ok(None);
        }
        Ok(Some(from_js(found)?))
    }

    /// Every stored row record whose `index` field ("table" or "bucket") equals `value`.
    pub async fn rows_where(&self, index: &str, value: &str) -> Result<Vec<RowRecord>, ClientError> {
        let tx = self.transaction(IdbTransactionMode::Readonly)?;
        let index = store(&tx, ROWS)?.index(index).map_err(ClientError::storage)?;
        let request = index.get_all_with_key(&value.into()).map_err(ClientError::storage)?;
        let found: Array = idb::settle(&request).await.map_err(ClientError::storage)?.unchecked_into();
        found.iter().map(from_js).collect()
    }
}

/// A running read-write transaction over every store. Dropped without `commit`, IndexedDB commits
/// whatever was queued; call `abort` to throw it away.
pub struct WriteTxn {
    tx: IdbTransaction,
}

impl WriteTxn {
    /// The stored records of `keys` that exist.
    pub async fn rows(&self, keys: &[RowKey]) -> Result<BTreeMap<RowKey, RowRecord>, ClientError> {
        read_rows(&store(&self.tx, ROWS)?, keys).await
    }

    /// Page `page_no` of the pull run in progress, as staged.
    pub async fn staged_page(&self, page_no: u32) -> Result<PullPage, ClientError> {
        from_js(get(&store(&self.tx, STAGING)?, &(page_no as f64).into()).await?)
    }

    /// Queues every operation; requests run in order, so a later put wins over an earlier one.
    pub fn apply(&self, ops: &[StoreOp]) -> Result<(), ClientError> {
        apply(&self.tx, ops)
    }

    /// Resolves once everything queued is durable.
    pub async fn commit(self) -> Result<(), ClientError> {
        idb::completion(&self.tx).await.map_err(ClientError::storage)
    }

    pub fn abort(self) {
        let _ = self.tx.abort();
    }
}

async fn read_rows(rows: &IdbObjectStore, keys: &[RowKey]) -> Result<BTreeMap<RowKey, RowRecord>, ClientError> {
    let mut found = BTreeMap::new();
    for key in keys {
        let value = get(rows, &row_key(&key.table, &key.pk)).await?;
        if !value.is_undefined() && !value.is_null() {
            found.insert(key.clone(), from_js(value)?);
        }
    }
    Ok(found)
}

fn store(tx: &IdbTransaction, name: &str) -> Result<IdbObjectStore, ClientError> {
    tx.object_store(name).map_err(ClientError::storage)
}

async fn get(store: &IdbObjectStore, key: &JsValue) -> Result<JsValue, ClientError> {
    let request = store.get(key).map_err(ClientError::storage)?;
    idb::settle(&request).await.map_err(ClientError::storage)
}

async fn get_all(store: &IdbObjectStore) -> Result<Vec<JsValue>, ClientError> {
    let request = store.get_all().map_err(ClientError::storage)?;
    let all: Array = idb::settle(&request).await.map_err(ClientError::storage)?.unchecked_into();
    Ok(all.iter().collect())
}

/// Queues every operation on `tx`. Requests run in order, so a later put wins over an earlier one.
fn apply(tx: &IdbTransaction, ops: &[StoreOp]) -> Result<(), ClientError> {
    let s = |name| store(tx, name);
    let fail = ClientError::storage;
    for op in ops {
        match op {
            StoreOp::PutRow(row) => {
                s(ROWS)?.put_with_key(&to_js(row)?, &row_key(&row.table, &row.pk)).map_err(fail)?;
            }
            StoreOp::DeleteRow(key) => {
                s(ROWS)?.delete(&row_key(&key.table, &key.pk)).map_err(fail)?;
            }
            StoreOp::PutOutbox(entry) => {
                s(OUTBOX)?.put_with_key(&to_js(entry)?, &(entry.seq as f64).into()).map_err(fail)?;
            }
            StoreOp::DeleteOutbox(seq) => {
                s(OUTBOX)?.delete(&(*seq as f64).into()).map_err(fail)?;
            }
            StoreOp::PutDead(dead) => {
                s(DEAD)?.put_with_key(&to_js(dead)?, &(dead.entry.seq as f64).into()).map_err(fail)?;
            }
            StoreOp::DeleteDead(seq) => {
                s(DEAD)?.delete(&(*seq as f64).into()).map_err(fail)?;
            }
            StoreOp::PutMeta(meta) => {
                s(META)?.put_with_key(&to_js(meta)?, &META_KEY.into()).map_err(fail)?;
            }
            StoreOp::PutStaging { page_no, page } => {
                s(STAGING)?.put_with_key(&to_js(page)?, &(*page_no as f64).into()).map_err(fail)?;
            }
            StoreOp::ClearStaging => {
                s(STAGING)?.clear().map_err(fail)?;
            }
            StoreOp::ClearRows => {
                s(ROWS)?.clear().map_err(fail)?;
            }
        }
    }
    Ok(())
}
