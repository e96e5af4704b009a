//! `client.on(name, listener)`: the engine's events as named JS events with plain-object payloads.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Function, Reflect};
use kizuna_engine::protocol::Conflict;
use kizuna_engine::{ChangeOrigin, DeadLetter, Event, OutboxEntry};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

/// Every event name a listener may subscribe to; `on` refuses others so a typo fails loudly.
pub const EVENT_NAMES: &[&str] = &[
    "change",
    "applied",
    "rejected",
    "deadLetter",
    "pushFailed",
    "pullFailed",
    "pullProgress",
    "checkpoint",
    "conflicts",
    "checkpointExpired",
    "serverReset",
    "rehydrated",
];

#[derive(Default)]
pub struct Listeners {
    next_id: u32,
    entries: Vec<(u32, String, Function)>,
    /// Replayed events (see `replay`) of names nobody listened to yet, for the first listener.
    held: Vec<Event>,
}

pub type SharedListeners = Rc<RefCell<Listeners>>;

impl Listeners {
    pub fn add(&mut self, name: &str, listener: Function) -> u32 {
        self.next_id += 1;
        self.entries.push((self.next_id, name.to_string(), listener));
        self.next_id
    }

    pub fn remove(&mut self, id: u32) {
        self.entries.retain(|(i, _, _)| *i != id);
    }

    /// Forgets every listener (and what was held for them): a closed client tells nothing more.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.held.clear();
    }

    /// The replayed events held for the first listener of `name`, handed over once.
    pub fn take_held(&mut self, name: &str) -> Vec<Event> {
        let (taken, kept) = std::mem::take(&mut self.held).into_iter().partition(|e| name_of(e) == name);
        self.held = kept;
        taken
    }

    fn listened(&self, name: &str) -> bool {
        self.entries.iter().any(|(_, n, _)| n == name)
    }
}

/// The events that say what became of the app's writes (and the journal's overwrites): a step
/// keeps them with its commit until they are told, because nothing else would tell them again
/// (see `WriteTxn::put_unheard`). The others are told again by what follows (a `change` by the
/// next read, progress by the next page).
pub fn lasting(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::Applied { .. } | Event::Rejected { .. } | Event::DeadLetter { .. } | Event::Conflicts(_)))
        .cloned()
        .collect()
}

/// Tells events a tab that went away had kept and not told (`WriteTxn::take_unheard`): to this
/// tab's listeners now, or, for a name nobody listens to yet (a page that just opened), to the
/// first listener `on` adds.
pub fn replay(listeners: &SharedListeners, events: Vec<Event>) {
    for event in events {
        if listeners.borrow().listened(name_of(&event)) {
            emit(listeners, std::slice::from_ref(&event));
        } else {
            listeners.borrow_mut().held.push(event);
        }
    }
}

/// Calls every listener of each event. A listener that throws is reported to the console and
/// does not stop the others; called after the store commit, so listeners see committed state.
/// A payload is built only for an event somebody listens to: a `change` naming 100,000 keys costs
/// its memory (which wasm never returns) and a second of work, for nobody otherwise.
pub fn emit(listeners: &SharedListeners, events: &[Event]) {
    for event in events {
        let name = name_of(event);
        let targets: Vec<Function> = listeners
            .borrow()
            .entries
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, f)| f.clone())
            .collect();
        if targets.is_empty() {
            continue;
        }
        let Ok(js) = payload(event) else { continue };
        for listener in targets {
            if let Err(err) = listener.call1(&JsValue::NULL, &js) {
                web_sys::console::error_2(&format!("kizuna: a '{name}' listener threw").into(), &err);
            }
        }
    }
}

fn origin(origin: &ChangeOrigin) -> &'static str {
    match origin {
        ChangeOrigin::Local => "local",
        ChangeOrigin::Remote => "remote",
        ChangeOrigin::Compensation => "compensation",
    }
}

/// A pending write as the app sees it (`pendingWrites()`, the `rejected` and `deadLetter`
/// events): camelCase, like every other payload, its keys in the order a JSON object of this
/// package spells them (sorted). Serialized straight to text for the getters: built as a JSON
/// value per entry first (a map of 17 keys and a copy of the row), `pendingWrites()` of 10,000
/// writes took 90 – 186 ms against 38 – 57 ms now, and a closed client's `let_go`, which keeps that
/// text, held up an `open()` of the same database right after `close()` (the bench's
/// `open_pending`: 458 – 543 ms before, 381 – 424 ms after, six alternating rounds).
pub struct EntryView<'a>(pub &'a OutboxEntry);

impl Serialize for EntryView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let mut m = s.serialize_struct("PendingWrite", 17)?;
        m.serialize_field("applyAfter", &e.apply_after)?;
        m.serialize_field("attempts", &e.attempts)?;
        m.serialize_field("batch", &e.batch)?;
        m.serialize_field("columns", &e.columns)?;
        m.serialize_field("createdAt", &e.created_at)?;
        m.serialize_field("hlc", &e.hlc)?;
        m.serialize_field("id", &e.id)?;
        m.serialize_field("lastError", &e.last_error)?;
        m.serialize_field("latestOnly", &e.latest_only)?;
        m.serialize_field("op", &e.op)?;
        m.serialize_field("permanentFailures", &e.permanent_failures)?;
        m.serialize_field("pk", &e.pk)?;
        m.serialize_field("readSeq", &e.read_seq)?;
        m.serialize_field("retryAt", &e.retry_at)?;
        m.serialize_field("sent", &e.sent)?;
        m.serialize_field("seq", &e.seq)?;
        m.serialize_field("table", &e.table)?;
        m.end()
    }
}

/// A dead letter as the app sees it (`deadLetters()`), keys sorted as `EntryView`'s.
pub struct DeadLetterView<'a>(pub &'a DeadLetter);

impl Serialize for DeadLetterView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("DeadLetter", 3)?;
        m.serialize_field("deadAt", &self.0.dead_at)?;
        m.serialize_field("entry", &EntryView(&self.0.entry))?;
        m.serialize_field("error", &self.0.error)?;
        m.end()
    }
}

/// An event's pending write as a JSON value.
pub fn entry_json(e: &OutboxEntry) -> Value {
    serde_json::to_value(EntryView(e)).unwrap_or_default()
}

fn conflict_json(c: &Conflict) -> Value {
    json!({
        "table": c.table, "pk": c.pk, "column": c.column, "loser": c.loser, "winner": c.winner,
        "loserSeq": c.loser_seq, "winnerSeq": c.winner_seq, "loserBy": c.loser_by,
    })
}

/// The JS name of an event (one of `EVENT_NAMES`).
fn name_of(event: &Event) -> &'static str {
    match event {
        Event::Change { .. } => "change",
        Event::Applied { .. } => "applied",
        Event::Rejected { .. } => "rejected",
        Event::DeadLetter { .. } => "deadLetter",
        Event::PushFailed { .. } => "pushFailed",
        Event::PullFailed { .. } => "pullFailed",
        Event::PullProgress { .. } => "pullProgress",
        Event::Checkpoint { .. } => "checkpoint",
        Event::Conflicts(_) => "conflicts",
        Event::CheckpointExpired => "checkpointExpired",
        Event::ServerReset => "serverReset",
        Event::Rehydrated { .. } => "rehydrated",
    }
}

/// An event's payload for its listeners. A refusal's server row nested too deep to decode in
/// wasm reaches them as `JSON.parse` reads the answer's text of it.
fn payload(event: &Event) -> Result<JsValue, JsValue> {
    let js = crate::js::encode(&describe(event)).map_err(|e| JsValue::from_str(&e))?;
    if let Event::Rejected { server_row_text: Some(text), .. } = event {
        Reflect::set(&js, &"serverRow".into(), &js_sys::JSON::parse(text)?)?;
    }
    Ok(js)
}

/// An event's payload, camelCase.
fn describe(event: &Event) -> Value {
    match event {
        Event::Change { keys, origin: o, tables } => {
            let mut payload = json!({ "origin": origin(o), "keys": keys.iter().map(|k| json!({"table": k.table, "pk": k.pk})).collect::<Vec<_>>() });
            if !tables.is_empty() {
                payload["tables"] = json!(tables);
            }
            payload
        }
        Event::Applied { id, key, seq, bucket } => json!({ "id": id, "table": key.table, "pk": key.pk, "seq": seq, "bucket": bucket }),
        Event::Rejected { mutation, reason, message, server_row, .. } => {
            json!({ "reason": reason.as_str(), "message": message, "mutation": entry_json(mutation), "serverRow": server_row })
        }
        Event::DeadLetter { entry, error } => json!({ "entry": entry_json(entry), "error": error }),
        Event::PushFailed { code, message, retryable } | Event::PullFailed { code, message, retryable } => {
            json!({ "code": code, "message": message, "retryable": retryable })
        }
        Event::PullProgress { pages, entries, total } => json!({ "pages": pages, "entries": entries, "total": total }),
        Event::Checkpoint { cursor, horizon } => json!({ "cursor": cursor, "horizon": horizon }),
        Event::Conflicts(conflicts) => json!({ "conflicts": conflicts.iter().map(conflict_json).collect::<Vec<_>>() }),
        Event::CheckpointExpired | Event::ServerReset => json!({}),
        Event::Rehydrated { horizon } => json!({ "horizon": horizon }),
    }
}
