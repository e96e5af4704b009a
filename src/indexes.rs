//! Equality indexes the app declares (`open({ indexes: { todos: ["done", "assignee"] } })`), so
//! `query(table, { where })` and `watch` find the rows whose column equals a value through
//! IndexedDB instead of reading the whole table.
//!
//! A stored row carries `eq`: one token per declared column of its table that holds a scalar in the
//! row the app sees (`visible`), `table␟column␟value-as-JSON`, under a multi-entry index. JSON tells
//! `1`, `"1"` and `true` apart, as the filter does. Undeclared tables pay nothing; a declared
//! column costs an index entry per row.

use std::collections::BTreeMap;

use kizuna_engine::RowRecord;
use serde_json::Value;

/// Declared columns, by table.
pub type Indexes = BTreeMap<String, Vec<String>>;

const SEPARATOR: char = '\u{1F}';

/// The token a row with `column` equal to `value` in `table` is found under; `None` for a value
/// that is not indexed (an object or an array). A number is written in one form for each double
/// (`as_js_number`): a server's `5.00` is found by the app's `5`, as `===` finds it.
pub fn token(table: &str, column: &str, value: &Value) -> Option<String> {
    let value = match value {
        Value::Object(_) | Value::Array(_) => return None,
        Value::Number(n) => as_js_number(n),
        scalar => scalar.clone(),
    };
    Some(format!("{table}{SEPARATOR}{column}{SEPARATOR}{value}"))
}

/// `n` in the one form the app's own number of that value crosses in (`values::number`): an
/// integer when the double is a whole one JS holds exactly, else the double.
fn as_js_number(n: &serde_json::Number) -> Value {
    n.as_f64().and_then(crate::values::number).unwrap_or_else(|| Value::Number(n.clone()))
}

/// The tokens of `record`, or `None` when its table declares no index.
pub fn tokens(indexes: &Indexes, record: &RowRecord) -> Option<Vec<String>> {
    let columns = indexes.get(&record.table)?;
    let row = record.visible.as_ref();
    Some(columns.iter().filter_map(|c| row.and_then(|r| r.get(c)).and_then(|v| token(&record.table, c, v))).collect())
}

/// The tokens of a row of `table` the server sent (its JSON text), or `None` when the table declares
/// no index. Only the declared columns are read, each only when it holds a scalar: the rest of the
/// row is skipped over as text, so a row nested past what a JSON value in wasm can be decoded to
/// (128 levels) is found by its scalars as any other, and a wide row is not decoded whole.
pub fn server_row_tokens(indexes: &Indexes, table: &str, row: &str) -> Result<Option<Vec<String>>, String> {
    let Some(columns) = indexes.get(table) else { return Ok(None) };
    let undecodable = |e: serde_json::Error| format!("a staged row does not decode: {e}");
    let fields: BTreeMap<std::borrow::Cow<'_, str>, &serde_json::value::RawValue> = serde_json::from_str(row).map_err(undecodable)?;
    let mut tokens = Vec::new();
    for column in columns {
        let Some(raw) = fields.get(column.as_str()) else { continue };
        if raw.get().starts_with(['[', '{']) {
            continue;
        }
        let value: Value = crate::pages::decode(raw.get()).map_err(undecodable)?;
        tokens.extend(token(table, column, &value));
    }
    Ok(Some(tokens))
}

/// The first condition of `conditions` that a declared index of `table` can answer, as its token.
pub fn lookup(indexes: &Indexes, table: &str, conditions: &serde_json::Map<String, Value>) -> Option<String> {
    let columns = indexes.get(table)?;
    conditions.iter().filter(|(c, _)| columns.contains(c)).find_map(|(c, v)| token(table, c, v))
}

/// The tables whose declared columns differ between `before` and `now`: their rows need new tokens.
pub fn changed_tables(before: &Indexes, now: &Indexes) -> Vec<String> {
    let mut tables: Vec<String> = before.keys().chain(now.keys()).cloned().collect();
    kizuna_engine::order::sort(&mut tables);
    tables.dedup();
    tables.retain(|t| before.get(t) != now.get(t));
    tables
}
