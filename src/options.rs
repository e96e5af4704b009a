//! `KizunaClient.open(options)`: the options object checked and turned into the engine's config
//! and the transport. Unknown keys are refused, so a misspelt option fails loudly.

use js_sys::Function;
use kizuna_engine::Config;
use serde::Deserialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::api::invalid;
use crate::values;
use crate::transport::Transport;

pub struct ClientOptions {
    pub name: String,
    /// Declared equality indexes (`indexes.rs`), each table's columns sorted and without repeats.
    pub indexes: crate::indexes::Indexes,
    pub config: Config,
    pub transport: Transport,
    pub auto_sync: bool,
    pub realtime_wakeups: bool,
    /// Bytes of a pull run's staged pages kept in memory (`store.rs`, `StagedInMemory`).
    pub staging_memory_bytes: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlainOptions {
    name: String,
    url: String,
    buckets: Vec<String>,
    apikey: Option<String>,
    auto_sync: Option<bool>,
    realtime_wakeups: Option<bool>,
    pull_interval_ms: Option<f64>,
    pull_limit: Option<u32>,
    max_slice: Option<u32>,
    retry_base_ms: Option<f64>,
    retry_max_ms: Option<f64>,
    request_timeout_ms: Option<i32>,
    latest_only_tables: Option<Vec<String>>,
    indexes: Option<crate::indexes::Indexes>,
    staging_memory_bytes: Option<f64>,
}

/// Every option `open` knows; any other key is refused so a misspelt option fails loudly.
const OPTION_NAMES: &[&str] = &[
    "name", "url", "token", "buckets", "apikey", "fetch", "autoSync", "realtimeWakeups", "pullIntervalMs",
    "pullLimit", "maxSlice", "retryBaseMs", "retryMaxMs", "requestTimeoutMs", "latestOnlyTables", "indexes",
    "stagingMemoryBytes",
];

/// The options that take a number.
const NUMBER_OPTIONS: &[&str] = &["pullIntervalMs", "pullLimit", "maxSlice", "retryBaseMs", "retryMaxMs", "requestTimeoutMs", "stagingMemoryBytes"];

fn js_function(options: &JsValue, key: &str) -> Result<Option<Function>, JsValue> {
    let value = values::property(options, key, &"options")?;
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    value.dyn_into::<Function>().map(Some).map_err(|_| invalid(format!("options.{key} must be a function")))
}

impl ClientOptions {
    pub fn parse(options: &JsValue) -> Result<ClientOptions, JsValue> {
        if !options.is_object() {
            return Err(invalid("options must be an object"));
        }
        if let Some(key) = values::unknown_key(options, &"options", OPTION_NAMES)? {
            return Err(invalid(format!("unknown option '{key}'; known: {}", OPTION_NAMES.join(", "))));
        }
        // JSON would carry NaN and the infinities as null, which reads as "not given".
        for key in NUMBER_OPTIONS {
            let value = values::property(options, key, &"options")?;
            if !(value.is_undefined() || value.is_null() || value.as_f64().is_some_and(f64::is_finite)) {
                return Err(invalid(format!("options.{key} must be a finite number")));
            }
        }
        let plain: PlainOptions = crate::js::decode(options).map_err(|e| invalid(format!("bad options: {e}")))?;
        let token = js_function(options, "token")?
            .ok_or_else(|| invalid("options.token must be a function returning the access token"))?;
        let fetch = js_function(options, "fetch")?;
        if plain.name.is_empty() {
            return Err(invalid("options.name must name the IndexedDB database"));
        }
        if !(plain.url.starts_with("http://") || plain.url.starts_with("https://")) {
            return Err(invalid("options.url must be an http(s) URL"));
        }
        if plain.buckets.iter().any(|b| b.is_empty()) {
            return Err(invalid("options.buckets must not contain empty names"));
        }
        // Waits longer than a browser timer holds (about 24.8 days) are held to that: added to the
        // clock, 1e300 ms overflowed, and the engine's next time fell into the past (a tight loop).
        const LONGEST_WAIT_MS: f64 = i32::MAX as f64;
        let mut config = Config { buckets: plain.buckets, ..Config::default() };
        if let Some(v) = plain.pull_interval_ms {
            config.pull_interval_ms = v.clamp(100.0, LONGEST_WAIT_MS) as i64;
        }
        if let Some(v) = plain.pull_limit {
            config.pull_limit = v.clamp(1, 10_000);
        }
        if let Some(v) = plain.max_slice {
            config.max_slice = v.clamp(1, 10_000) as usize;
        }
        if let Some(v) = plain.retry_base_ms {
            config.retry_base_ms = v.clamp(1.0, LONGEST_WAIT_MS) as i64;
        }
        if let Some(v) = plain.retry_max_ms {
            config.retry_max_ms = v.clamp(1.0, LONGEST_WAIT_MS) as i64;
        }
        config.latest_only_tables = kizuna_engine::order::set_of(plain.latest_only_tables.unwrap_or_default());
        let transport = Transport {
            base_url: plain.url,
            token,
            fetch,
            apikey: plain.apikey,
            request_timeout_ms: plain.request_timeout_ms.unwrap_or(30_000).max(100),
        };
        let auto_sync = plain.auto_sync.unwrap_or(true);
        let mut indexes = plain.indexes.unwrap_or_default();
        for (table, columns) in indexes.iter_mut() {
            if table.is_empty() || columns.iter().any(|c| c.is_empty()) {
                return Err(invalid("options.indexes names a table or a column that is empty"));
            }
            kizuna_engine::order::sort(columns);
            columns.dedup();
        }
        indexes.retain(|_, columns| !columns.is_empty());
        Ok(ClientOptions {
            name: plain.name,
            indexes,
            config,
            transport,
            auto_sync,
            realtime_wakeups: auto_sync && plain.realtime_wakeups.unwrap_or(true),
            staging_memory_bytes: plain.staging_memory_bytes.map_or(crate::store::STAGING_MEMORY_BYTES, |b| b.max(0.0) as usize),
        })
    }
}
