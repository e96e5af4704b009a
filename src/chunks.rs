//! The rows a run from `null` brings (a first sync, a rehydration), stored by the hundred.
//!
//! IndexedDB's cost is per record, not per byte: in raw IndexedDB in Chromium, 100,000 rows of
//! about 200 B took 5.8 – 6.0 s as a record each and 0.67 – 0.69 s as records of 100 rows with
//! their keys in a `multiEntry` index (`bench/layout/layout.sh`), against 1.7 – 4.5 s for the
//! gateway's pages to be fetched and parsed. So such a run's rows that no write of ours touches are
//! stored as chunks: `{id: [table, n], table, keys: [[table, pk], ...], buckets, text}`, `text`
//! the JSON array of its records, each exactly as the `rows` store would hold it, in key order. As
//! text, a chunk is cloned into IndexedDB as one string: held as 100 objects, its put's structured
//! clone was most of a first sync's closing transaction (0.65 s of 100,000 rows' 1.3 – 1.6 s).
//! A key is in one place: a chunk or its own record. Every later write of a key (a local write, a
//! pull, a verdict) stores it as its own record and takes it out of its chunk in the same
//! transaction (`Unchunking`); reads look in both.
//!
//! Only tables that declare no equality index are chunked (their rows carry no tokens here); a
//! declaration that names a chunked table moves its rows out of their chunks (`Store::settle`).
//! Chunks are written only by a run from `null`, whose commit clears every row and chunk first, so
//! their ids, `[table, n]` with `n` counted in that transaction, never meet another's.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::Write;

use indexed_db_futures::database::Database;
use indexed_db_futures::object_store::ObjectStore;
use indexed_db_futures::prelude::*;
use indexed_db_futures::KeyPath;
use js_sys::{Array, Reflect};
use kizuna_engine::RowKey;
use wasm_bindgen::prelude::*;

use crate::error::ClientError;
use crate::store::{failed, present, row_key, RowRequest};

pub(crate) const CHUNKS: &str = "chunks";
/// Rows per chunk: the fewer, the less a chunk's rewrite costs when one of its keys is written;
/// per 1,000 rows a first sync took 0.83 s against 0.68 s per 100 (raw IndexedDB, as above).
pub(crate) const CHUNK_ROWS: usize = 100;

/// Creates the `chunks` store (schema 5): its key is the chunk's `id`; `keys` finds the chunk of a
/// row key, `bucket` the chunks holding a bucket's rows.
pub(crate) fn create(db: &Database) -> indexed_db_futures::Result<()> {
    let chunks = db.create_object_store(CHUNKS).with_key_path(KeyPath::One("id")).build()?;
    chunks.create_index("keys", KeyPath::One("keys")).with_unique(false).with_multi_entry(true).build()?;
    chunks.create_index("bucket", KeyPath::One("buckets")).with_unique(false).with_multi_entry(true).build()?;
    Ok(())
}

fn field(value: &JsValue, name: &str) -> JsValue {
    Reflect::get(value, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

fn set(object: &JsValue, name: &str, value: &JsValue) {
    let _ = Reflect::set(object, &JsValue::from_str(name), value);
}

/// A chunk's records, in key order.
pub(crate) fn records(chunk: &JsValue) -> Result<Array, ClientError> {
    let parsed = field(chunk, "text").as_string().and_then(|text| js_sys::JSON::parse(&text).ok());
    parsed.and_then(|a| a.dyn_into::<Array>().ok()).ok_or_else(|| ClientError::new("STORAGE_CORRUPT", "a chunk of rows does not decode"))
}

/// The chunks one read found, each parsed once: the keys of a step or a live query's refresh
/// often share a chunk, and each lookup answers with the whole chunk.
#[derive(Default)]
pub(crate) struct ParsedChunks(BTreeMap<String, Array>);

impl ParsedChunks {
    /// The record of `pk` in `chunk`, if it holds one.
    pub fn record_of(&mut self, chunk: &JsValue, pk: &str) -> Result<Option<JsValue>, ClientError> {
        let records = match self.0.entry(chunk_name(chunk)) {
            std::collections::btree_map::Entry::Occupied(found) => found.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => slot.insert(records(chunk)?),
        };
        let pk = JsValue::from_str(pk);
        Ok(records.iter().find(|r| field(r, "pk") == pk))
    }
}

/// A chunk's id, `[table, n]`, as one string.
fn chunk_name(chunk: &JsValue) -> String {
    let id = Array::from(&field(chunk, "id"));
    format!("{}\u{1F}{}", id.get(0).as_string().unwrap_or_default(), id.get(1).as_string().unwrap_or_default())
}

/// A row a chunk takes: its key, its bucket and its row's JSON text as the server sent it.
pub(crate) struct ChunkRow<'p> {
    pub pk: Cow<'p, str>,
    pub bucket: Cow<'p, str>,
    pub row: &'p str,
}

/// Queues the puts of `rows` of `table` (records `{table, pk, bucket, base}`), `CHUNK_ROWS` to a
/// chunk in key order, numbering the chunks from `*next`. Each chunk is put together as text: its
/// head parsed once, its records left as their text.
pub(crate) fn put(chunks: &ObjectStore<'_>, table: &str, mut rows: Vec<ChunkRow<'_>>, next: &mut u32) -> Result<(), ClientError> {
    let encode = |e: serde_json::Error| ClientError::new("STORAGE_FAILED", format!("cannot encode a chunk: {e}"));
    // IndexedDB orders strings by UTF-16 code units, which is not Rust's order for every string.
    kizuna_engine::order::sort_by(&mut rows, |a, b| a.pk.encode_utf16().cmp(b.pk.encode_utf16()));
    for group in rows.chunks(CHUNK_ROWS) {
        let (mut head, mut text) = (Vec::with_capacity(64 * group.len()), Vec::with_capacity(256 * group.len()));
        head.extend_from_slice(b"{\"id\":[");
        serde_json::to_writer(&mut head, table).map_err(encode)?;
        write!(head, ",\"{:08}\"],\"table\":", *next).map_err(|e| ClientError::new("STORAGE_FAILED", e.to_string()))?;
        serde_json::to_writer(&mut head, table).map_err(encode)?;
        head.extend_from_slice(b",\"keys\":[");
        let mut buckets: Vec<&str> = Vec::new();
        text.push(b'[');
        for (i, row) in group.iter().enumerate() {
            if i > 0 {
                head.push(b',');
                text.push(b',');
            }
            head.push(b'[');
            serde_json::to_writer(&mut head, table).map_err(encode)?;
            head.push(b',');
            serde_json::to_writer(&mut head, row.pk.as_ref()).map_err(encode)?;
            head.push(b']');
            if !buckets.contains(&row.bucket.as_ref()) {
                buckets.push(&row.bucket);
            }
            text.extend_from_slice(b"{\"table\":");
            serde_json::to_writer(&mut text, table).map_err(encode)?;
            text.extend_from_slice(b",\"pk\":");
            serde_json::to_writer(&mut text, row.pk.as_ref()).map_err(encode)?;
            text.extend_from_slice(b",\"bucket\":");
            serde_json::to_writer(&mut text, row.bucket.as_ref()).map_err(encode)?;
            text.extend_from_slice(b",\"base\":");
            text.extend_from_slice(row.row.as_bytes());
            text.push(b'}');
        }
        text.push(b']');
        head.extend_from_slice(b"],\"buckets\":");
        serde_json::to_writer(&mut head, &buckets).map_err(encode)?;
        head.push(b'}');
        // serde_json writes UTF-8 only, and the rows' text is the server's, checked as UTF-8.
        let utf8 = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|e| ClientError::new("STORAGE_FAILED", e.to_string()));
        let chunk = js_sys::JSON::parse(&utf8(head)?).map_err(|_| ClientError::new("STORAGE_FAILED", "JSON.parse refused a chunk's head"))?;
        set(&chunk, "text", &JsValue::from_str(&utf8(text)?));
        *next += 1;
        drop(chunks.put(chunk).primitive().map_err(failed)?);
    }
    Ok(())
}

/// Issues the read of the chunk that holds `key` (answered `None` when none does).
pub(crate) fn request_chunk(chunks: &ObjectStore<'_>, key: &RowKey) -> Result<RowRequest, ClientError> {
    chunks.index("keys").map_err(failed)?.get::<JsValue, _, _>(row_key(&key.table, &key.pk)).primitive().map_err(failed)
}

/// The keys a transaction writes as records of their own, each looked up in the chunks as it is
/// written; as the transaction commits, every chunk found loses them, once, whichever of its keys
/// were written (`finish`). A chunk is read before the write of its key is queued, and rewritten
/// after every request of the step: nothing between reads a chunk but these lookups, which a
/// chunk's first rewrite in the transaction would answer alike.
#[derive(Default)]
pub(crate) struct Unchunking {
    lookups: Vec<(String, RowRequest)>,
}

impl Unchunking {
    pub fn look_up(&mut self, chunks: &ObjectStore<'_>, key: &RowKey) -> Result<(), ClientError> {
        let request = request_chunk(chunks, key)?;
        self.lookups.push((key.pk.clone(), request));
        Ok(())
    }

    /// Takes every looked-up key out of its chunk: a chunk left with no row is deleted.
    pub async fn finish(self, chunks: &ObjectStore<'_>) -> Result<(), ClientError> {
        // By chunk id (its number, as text): the chunk and the keys it loses.
        let mut losing: BTreeMap<String, (JsValue, Vec<JsValue>)> = BTreeMap::new();
        for (pk, request) in self.lookups {
            let Some(chunk) = present(request.await.map_err(failed)?) else { continue };
            losing.entry(chunk_name(&chunk)).or_insert_with(|| (chunk, Vec::new())).1.push(JsValue::from_str(&pk));
        }
        for (chunk, gone) in losing.into_values() {
            let (keys, buckets, kept) = (Array::new(), Array::new(), Array::new());
            let table = field(&chunk, "table");
            for record in records(&chunk)?.iter() {
                let pk = field(&record, "pk");
                if gone.contains(&pk) {
                    continue;
                }
                keys.push(&Array::of2(&table, &pk));
                let bucket = field(&record, "bucket");
                if bucket.is_string() && !buckets.includes(&bucket, 0) {
                    buckets.push(&bucket);
                }
                kept.push(&record);
            }
            if kept.length() == 0 {
                drop(chunks.delete(field(&chunk, "id")).primitive().map_err(failed)?);
            } else {
                set(&chunk, "keys", &keys);
                set(&chunk, "buckets", &buckets);
                set(&chunk, "text", &JsValue::from(js_sys::JSON::stringify(&kept).map_err(|e| failed(crate::error::describe(&e)))?));
                drop(chunks.put(chunk).primitive().map_err(failed)?);
            }
        }
        Ok(())
    }
}

/// JS's `<` on two keys (strings: by UTF-16 code units, as IndexedDB orders them), as an ordering.
fn order(a: &JsValue, b: &JsValue) -> Ordering {
    if a.lt(b) {
        Ordering::Less
    } else if b.lt(a) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// The next record of one source in `merge`.
struct Head {
    table: JsValue,
    pk: JsValue,
    source: usize,
    at: u32,
}

impl Ord for Head {
    // Reversed: `BinaryHeap` pops the greatest, `merge` wants the least.
    fn cmp(&self, other: &Self) -> Ordering {
        order(&other.table, &self.table).then_with(|| order(&other.pk, &self.pk)).then_with(|| other.source.cmp(&self.source))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// Hands `each` the records of `sources`, each source sorted by table and key, in that order
/// across them all (the order the `rows` store gives): the rows' own records and each chunk's.
/// Merged a head per source, so wasm memory holds one entry per chunk, never one per row (a
/// million rows listed took wasm memory from 3.3 MB to 49 MB when they were sorted whole).
pub(crate) fn merge(sources: &[Array], mut each: impl FnMut(&JsValue)) {
    let (table, pk) = (JsValue::from_str("table"), JsValue::from_str("pk"));
    let head = |source: usize, at: u32| {
        let record = sources[source].get(at);
        Head { table: Reflect::get(&record, &table).unwrap_or(JsValue::UNDEFINED), pk: Reflect::get(&record, &pk).unwrap_or(JsValue::UNDEFINED), source, at }
    };
    let mut heads: BinaryHeap<Head> = (0..sources.len()).filter(|&s| sources[s].length() > 0).map(|s| head(s, 0)).collect();
    while let Some(Head { source, at, .. }) = heads.pop() {
        each(&sources[source].get(at));
        if at + 1 < sources[source].length() {
            heads.push(head(source, at + 1));
        }
    }
}
