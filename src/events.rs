//! `client.on(name, listener)`: the engine's events as named JS events with plain-object payloads.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::Function;
use kizuna_engine::{ChangeOrigin, Event};
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
}

/// Calls every listener of each event. A listener that throws is reported to the console and
/// does not stop the others; called after the store commit, so listeners see committed state.
pub fn emit(listeners: &SharedListeners, events: &[Event]) {
    for event in events {
        let (name, payload) = describe(event);
        let Ok(js) = crate::js::encode(&payload) else { continue };
        let targets: Vec<Function> = listeners
            .borrow()
            .entries
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, f)| f.clone())
            .collect();
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

fn describe(event: &Event) -> (&'static str, Value) {
    match event {
        Event::Change { keys, origin: o } => (
            "change",
            json!({ "origin": origin(o), "keys": keys.iter().map(|k| json!({"table": k.table, "pk": k.pk})).collect::<Vec<_>>() }),
        ),
        Event::Applied { id, seq } => ("applied", json!({ "id": id, "seq": seq })),
        Event::Rejected { mutation, reason, server_row } => (
            "rejected",
            json!({ "reason": reason.as_str(), "mutation": mutation, "serverRow": server_row }),
        ),
        Event::DeadLetter { entry, error } => ("deadLetter", json!({ "entry": entry, "error": error })),
        Event::PushFailed { code, message, retryable } => {
            ("pushFailed", json!({ "code": code, "message": message, "retryable": retryable }))
        }
        Event::PullFailed { code, message, retryable } => {
            ("pullFailed", json!({ "code": code, "message": message, "retryable": retryable }))
        }
        Event::PullProgress { pages, entries } => ("pullProgress", json!({ "pages": pages, "entries": entries })),
        Event::Checkpoint { cursor, horizon } => ("checkpoint", json!({ "cursor": cursor, "horizon": horizon })),
        Event::Conflicts(conflicts) => ("conflicts", json!({ "conflicts": conflicts })),
        Event::CheckpointExpired => ("checkpointExpired", json!({})),
        Event::ServerReset => ("serverReset", json!({})),
        Event::Rehydrated { horizon } => ("rehydrated", json!({ "horizon": horizon })),
    }
}
