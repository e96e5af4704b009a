//! Pull pages as the client reads them: every page is read for its head alone, its rows left as
//! text. A page before the closing one is staged as the text it came in, and the closing page's
//! text goes to the commit plan, which places its entries as a staged page's: a row no write of
//! ours touches is stored as the server sent it (one `JSON.parse`), never decoded into wasm
//! memory, on whichever page it came. Decoding every row only to encode it again was most of what
//! a first sync's pages phase spent in wasm, and every incremental pull decoded its one page
//! twice. Numbers are read as `JSON.parse` reads them (`js_safe_text` for the rows decoded).

use std::borrow::Cow;

use kizuna_engine::PageHead;
use kizuna_protocol::{js_safe_text, nesting_exceeds, read_deep, Conflict, Lifecycle, PushResponse, Row, MAX_READ_DEPTH};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A pulled page, as the engine takes it (`Engine::on_pull_page_text`): its head, and its text.
pub struct Pulled {
    pub head: PageHead,
    pub text: String,
}

/// A page's JSON with its entries' rows left as text: how an answer is read before it is staged,
/// and how a staged page is read back by the closing transaction.
#[derive(Deserialize)]
pub struct PageText<'a> {
    cursor: String,
    done: bool,
    horizon: i64,
    // Both left as text and decoded through a JSON value, as the client's other answers are (one
    // more decoder of each would be package size).
    #[serde(borrow, default)]
    lifecycle: Option<&'a RawValue>,
    #[serde(borrow, default)]
    conflicts: Option<&'a RawValue>,
    #[serde(default)]
    total: Option<u64>,
    #[serde(borrow)]
    pub entries: Vec<StagedEntry<'a>>,
}

/// `kizuna_protocol::Entry` with its row undecoded (and its names borrowed from the text where
/// they hold no escapes).
#[derive(Deserialize)]
pub struct StagedEntry<'a> {
    pub seq: i64,
    #[serde(borrow)]
    pub table: Cow<'a, str>,
    #[serde(borrow)]
    pub pk: Cow<'a, str>,
    #[serde(borrow)]
    pub bucket: Cow<'a, str>,
    #[serde(borrow, default)]
    pub row: Option<&'a RawValue>,
    #[serde(default)]
    pub deleted: bool,
}

/// Reads a pull answer: its head, and its text for the engine. A page whose head or entries'
/// names would not decode as a `PullPage`'s, or whose rows are not objects, is refused here, so a
/// bad page is never staged or committed.
pub fn read_page(text: String) -> Result<Pulled, String> {
    let page: PageText<'_> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let lifecycle: Option<Lifecycle> = match page.lifecycle {
        Some(raw) => decode(raw.get()).map_err(|e| e.to_string())?,
        None => None,
    };
    let conflicts: Option<Vec<Conflict>> = match page.conflicts {
        Some(raw) => decode(raw.get()).map_err(|e| e.to_string())?,
        None => None,
    };
    if let Some(entry) = page.entries.iter().find(|e| e.row.is_some_and(|row| !row.get().starts_with('{'))) {
        return Err(format!("the row of {}/{} is not an object", entry.table, entry.pk));
    }
    let head = PageHead {
        cursor: page.cursor,
        done: page.done,
        horizon: page.horizon,
        lifecycle,
        conflicts,
        total: page.total,
        entries: page.entries.len(),
    };
    Ok(Pulled { head, text })
}

/// Reads a push answer. A refusal's server row nested deeper than wasm decodes (`MAX_READ_DEPTH`;
/// a `jsonb` value written in plain SQL) is kept as the text it came in
/// (`Verdict::server_row_text`), and the answer is decoded with `null` in its place. Before, the
/// whole answer failed as `NETWORK` each time its slice was resent, and every write behind the
/// refused one waited.
pub fn read_push_response(text: &str) -> Result<PushResponse, serde_json::Error> {
    // Decoded at once (`read_deep` measures the nesting itself); measured again only when that
    // fails, so an answer of ordinary depth is scanned once.
    match decode(text) {
        Err(_) if nesting_exceeds(text.as_bytes(), MAX_READ_DEPTH) => {}
        answer => return answer,
    }
    // Where each verdict's server row lies in the text; the rest is skipped, and serde_json reads
    // a raw value without recursing.
    #[derive(Deserialize)]
    struct Rows<'a> {
        #[serde(borrow)]
        verdicts: Vec<VerdictRow<'a>>,
    }
    #[derive(Deserialize)]
    struct VerdictRow<'a> {
        #[serde(borrow, default)]
        server_row: Option<&'a RawValue>,
    }
    let rows = serde_json::from_str::<Rows<'_>>(text)?;
    let (mut shallow, mut copied, mut deep) = (String::with_capacity(text.len()), 0, Vec::new());
    for (i, row) in rows.verdicts.iter().enumerate() {
        // A row lies three levels down: in the answer, its verdicts, the verdict.
        let Some(row) = row.server_row.map(RawValue::get).filter(|row| nesting_exceeds(row.as_bytes(), MAX_READ_DEPTH - 3)) else { continue };
        let at = row.as_ptr() as usize - text.as_ptr() as usize;
        shallow.push_str(&text[copied..at]);
        shallow.push_str("null");
        copied = at + row.len();
        deep.push((i, row));
    }
    shallow.push_str(&text[copied..]);
    let mut answer: PushResponse = decode(&shallow)?;
    for (i, row) in deep {
        if let Some(verdict) = answer.verdicts.get_mut(i) {
            verdict.server_row_text = Some(row.to_string());
        }
    }
    Ok(answer)
}

/// Decodes a server's answer, numbers as `JSON.parse` reads them (`js_safe_text`) and nested as
/// deep as `read_deep` reads: straight from the text, so the package carries one decoder of each
/// answer, not a second one through a JSON value.
pub fn decode<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    read_deep(&js_safe_text(text))
}

/// A staged row's text as a row, numbers as `JSON.parse` reads them. Through a JSON value, which
/// the package decodes anyway: a decoder of rows straight from text would be one more in it.
pub fn staged_row(text: &str) -> Result<Row, String> {
    match decode(text) {
        Ok(Value::Object(row)) => Ok(row),
        Ok(_) => Err("a staged row is not an object".into()),
        Err(e) => Err(format!("a staged row does not decode: {e}")),
    }
}

