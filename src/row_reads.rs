//! Reading the stored records of the keys a step writes. A write reads before it writes (an
//! upsert assigns the columns it names over the stored row), and one `get` per key is most of what
//! a large batch adds to its own puts: in raw IndexedDB in Chromium, 1,000 gets before 1,000 puts
//! of new rows took the transaction from 65 – 70 ms to 100 ms. So the keys of a table that a step
//! writes many of are first asked for as one `getAllKeys` over the range between the least and
//! the greatest of them, and only the keys found there are read: a batch of new rows reads nothing
//! more. A range that holds more than twice as many keys as the step writes (its keys spread over
//! a large table) is not read whole: those keys are then read one `get` each, as a small step's are.
//!
//! A key of a table with rows in chunks (`chunks.rs`) is also looked up in them, beside its own
//! record, which wins when both answer (a key in a chunk has no record of its own).

use std::collections::{BTreeMap, BTreeSet};

use indexed_db_futures::object_store::ObjectStore;
use indexed_db_futures::prelude::*;
use js_sys::Array;
use kizuna_engine::order::set_of;
use kizuna_engine::{RowKey, RowRecord};
use wasm_bindgen::prelude::*;

use crate::error::ClientError;
use crate::chunks::{request_chunk, ParsedChunks};
use crate::store::{failed, from_js, present, request_rows, row_key, RowRequest};

/// The fewest keys of one table a step writes for them to be asked for as a range first.
pub(crate) const RANGE_READ_MIN: usize = 32;

type KeysRequest = indexed_db_futures::future::GetAllPrimitiveRequest<JsValue>;

/// Reads issued and not yet awaited: every request goes before the first answer is awaited, so
/// the reads share one round trip with whatever the caller issued beside them.
pub struct RowReads<'a> {
    rows: ObjectStore<'a>,
    chunks: ObjectStore<'a>,
    records: Vec<(RowKey, RowRequest)>,
    /// A table's keys written, with the request for the stored keys in their range.
    ranges: Vec<(Vec<RowKey>, KeysRequest)>,
    /// The keys of tables with rows in chunks as known when issued, each with the read of its chunk.
    in_chunks: Vec<(RowKey, RowRequest)>,
    /// Every key asked for.
    keys: Vec<RowKey>,
}

impl<'a> RowReads<'a> {
    /// Issues the reads of `keys`' records in the `rows` store, and in the chunks for the keys of
    /// the tables in `chunked` (`None`: every key).
    pub fn issue(rows: ObjectStore<'a>, chunks: ObjectStore<'a>, keys: &[RowKey], chunked: Option<&BTreeSet<String>>) -> Result<RowReads<'a>, ClientError> {
        let mut in_chunks = Vec::new();
        for key in keys.iter().filter(|k| chunked.is_none_or(|tables| tables.contains(&k.table))) {
            in_chunks.push((key.clone(), request_chunk(&chunks, key)?));
        }
        let mut reads = RowReads { rows, chunks, records: Vec::new(), ranges: Vec::new(), in_chunks, keys: keys.to_vec() };
        // A step writes to few tables: a list is enough.
        let mut by_table: Vec<(&str, Vec<RowKey>)> = Vec::new();
        for key in keys {
            match by_table.iter_mut().find(|(table, _)| *table == key.table) {
                Some((_, group)) => group.push(key.clone()),
                None => by_table.push((&key.table, vec![key.clone()])),
            }
        }
        for (table, keys) in by_table {
            if keys.len() < RANGE_READ_MIN {
                reads.request_records(keys)?;
                continue;
            }
            // IndexedDB orders strings by UTF-16 code units, which is not Rust's order for every string.
            let utf16 = |a: &&RowKey, b: &&RowKey| a.pk.encode_utf16().cmp(b.pk.encode_utf16());
            let (Some(lo), Some(hi)) = (keys.iter().min_by(utf16), keys.iter().max_by(utf16)) else { continue };
            let range = web_sys::IdbKeyRange::bound(&row_key(table, &lo.pk), &row_key(table, &hi.pk))
                .map_err(|e| failed(crate::error::describe(&e)))?;
            let limit = (2 * keys.len() + 1) as u32;
            let request = reads.rows.get_all_keys::<JsValue>().with_query::<JsValue, _>(JsValue::from(range)).with_limit(limit).primitive().map_err(failed)?;
            reads.ranges.push((keys, request));
        }
        Ok(reads)
    }

    fn request_records(&mut self, keys: Vec<RowKey>) -> Result<(), ClientError> {
        let requests = request_rows(&self.rows, &keys)?;
        self.records.extend(keys.into_iter().zip(requests));
        Ok(())
    }

    /// The records that exist. `chunked`: the tables with rows in chunks as known now, when the
    /// reads were issued before it was (their keys not looked up then are looked up now).
    pub async fn found(mut self, chunked: Option<&BTreeSet<String>>) -> Result<BTreeMap<RowKey, RowRecord>, ClientError> {
        let mut stored = Vec::new();
        for (keys, request) in std::mem::take(&mut self.ranges) {
            let in_range: Vec<JsValue> = request.await.map_err(failed)?.map(|k| k.map_err(failed)).collect::<Result<_, _>>()?;
            if in_range.len() > 2 * keys.len() {
                stored.extend(keys);
                continue;
            }
            let pks = set_of(in_range.iter().filter_map(|k| Array::from(k).get(1).as_string()));
            stored.extend(keys.into_iter().filter(|k| pks.contains(&k.pk)));
        }
        self.request_records(stored)?;
        let mut found = BTreeMap::new();
        for (key, request) in std::mem::take(&mut self.records) {
            if let Some(value) = present(request.await.map_err(failed)?) {
                found.insert(key, from_js(value)?);
            }
        }
        let asked = set_of(self.in_chunks.iter().map(|(k, _)| k.clone()));
        for key in self.keys.iter().filter(|k| !asked.contains(*k) && chunked.is_some_and(|tables| tables.contains(&k.table))) {
            self.in_chunks.push((key.clone(), request_chunk(&self.chunks, key)?));
        }
        let mut parsed = ParsedChunks::default();
        for (key, request) in self.in_chunks {
            let chunk = present(request.await.map_err(failed)?);
            if found.contains_key(&key) {
                continue;
            }
            if let Some(record) = chunk.map(|c| parsed.record_of(&c, &key.pk)).transpose()?.flatten() {
                found.insert(key, from_js(record)?);
            }
        }
        Ok(found)
    }
}
