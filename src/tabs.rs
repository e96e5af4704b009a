//! Many tabs, one database. Every tab (window, worker) of an origin may open the same database
//! name: each writes, reads and queries it directly, and each hears every event. One of them, the
//! leader, runs the push and pull loops and the wake stream for all.
//!
//! * **Election.** The leader holds the database's Web Lock (`leader.rs`); the others wait in the
//!   browser's queue, which hands the lock on at once when the leader closes or crashes.
//! * **News.** A `BroadcastChannel` named after the database carries every committed step (its
//!   events, and the stamp it left in the `sync` record), the leader's heartbeats and health, and
//!   `sync()`/`pull()` calls that followers hand to the leader.
//! * **Frozen leaders.** A frozen tab keeps its locks. A follower that has heard nothing from the
//!   leader for `SILENCE_MS` pings it; a leader that is merely throttled answers at once (message
//!   events are not throttled like timers), a frozen one cannot, and after `PONG_WAIT_MS` the
//!   follower steals the lock. The stolen leader learns it from its lock request, and until then
//!   every step it tries is refused, because its transactions find another leader named in the
//!   `sync` record.
//! * **Shared state.** The store is the only shared memory: every step reloads the engine's state
//!   inside its own transaction when another tab committed since (`Inner::begin`), so sequence
//!   numbers follow commit order across tabs and nothing one tab wrote is lost by another.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use gloo_timers::callback::{Interval, Timeout};
use js_sys::{Function, Promise};
use kizuna_engine::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::{spawn_local, JsFuture};

use crate::error::ClientError;
use crate::leader::LeaderLock;
use crate::runner::{now, Inner};
use crate::scheduler;

/// How often the leader says it is alive.
const HEARTBEAT_MS: u32 = 250;
/// How often a follower looks at the leader's silence.
const WATCHDOG_MS: u32 = 150;
/// Silence after which a follower pings the leader (plus up to `SILENCE_JITTER_MS`, so followers
/// do not all steal at once).
const SILENCE_MS: f64 = 400.0;
const SILENCE_JITTER_MS: f64 = 200.0;
/// How long a pinged leader has to answer before a follower takes the lock from it.
const PONG_WAIT_MS: f64 = 300.0;

/// What tabs of one database tell each other.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Message {
    /// A step committed: its events, and the stamp it left.
    Commit { from: String, version: f64, events: Vec<Event>, health: Option<Value> },
    /// The leader is alive; its sync health.
    Heartbeat { from: String, health: Value },
    /// `from` now leads.
    Leader { from: String },
    Ping { from: String },
    Pong { from: String },
    /// A follower's `sync()` or `pull()`, for the leader to run.
    Call { from: String, id: u32, method: String },
    /// The leader's answer to call `id` of tab `to`.
    Answer { to: String, id: u32, ok: Option<Value>, error: Option<ErrorJson> },
}

/// `events` as text, in the shape of a `Commit` message: how a step keeps its events in the store
/// (`WriteTxn::put_unheard`). Read back by `events_of`, with the decoder the messages use: serde
/// generates a separate decoder of every event type for each way of reading them (an internally
/// tagged message reads them through a buffer), and a second one cost the package 8 KB gzipped.
pub fn events_text(events: Vec<Event>) -> Result<String, String> {
    serde_json::to_string(&Message::Commit { from: String::new(), version: 0.0, events, health: None }).map_err(|e| e.to_string())
}

/// The events `events_text` wrote.
pub fn events_of(text: &str) -> Result<Vec<Event>, String> {
    match kizuna_protocol::read_deep::<Message>(text).map_err(|e| e.to_string())? {
        Message::Commit { events, .. } => Ok(events),
        _ => Err("not a record of events".into()),
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct ErrorJson {
    code: String,
    message: String,
    retryable: Option<bool>,
}

/// A follower's call waiting for the leader's answer.
struct PendingCall {
    method: String,
    resolve: Function,
    reject: Function,
}

impl PendingCall {
    /// Settles the caller's promise with the call's outcome, wherever it ran.
    fn settle(self, outcome: Result<Value, ClientError>) {
        let _ = match outcome {
            Ok(value) => self.resolve.call1(&JsValue::NULL, &crate::js::encode(&value).unwrap_or(JsValue::NULL)),
            Err(e) => self.reject.call1(&JsValue::NULL, &e.into()),
        };
    }
}

impl From<ClientError> for ErrorJson {
    fn from(e: ClientError) -> Self {
        ErrorJson { code: e.code, message: e.message, retryable: e.retryable }
    }
}

impl From<ErrorJson> for ClientError {
    fn from(e: ErrorJson) -> Self {
        ClientError { code: e.code, message: e.message, retryable: e.retryable }
    }
}

pub struct Tabs {
    /// This client's id among the tabs.
    pub tab: String,
    name: String,
    channel: Option<web_sys::BroadcastChannel>,
    on_message: RefCell<Option<Closure<dyn FnMut(web_sys::MessageEvent)>>>,
    leading: Cell<bool>,
    /// The tab last heard leading.
    leader: RefCell<Option<String>>,
    last_heard: Cell<f64>,
    ping_sent: Cell<Option<f64>>,
    silence_ms: f64,
    lock: RefCell<Option<LeaderLock>>,
    heartbeat: RefCell<Option<Interval>>,
    watchdog: RefCell<Option<Interval>>,
    /// This tab's calls waiting for the leader's answer, by id, in the order they were made.
    calls: RefCell<Vec<(u32, PendingCall)>>,
    next_call: Cell<u32>,
    /// The leader's health as last heard (a follower's `getSyncHealth`).
    leader_health: RefCell<Option<Value>>,
    inbox: RefCell<VecDeque<Message>>,
    draining: Cell<bool>,
    /// Messages waiting to be posted, in order. Posting (encoding, structured cloning, handing to
    /// the browser) waits for a 0 ms timer, so the step that committed settles its promise first
    /// and the posting overlaps the next step's wait for IndexedDB.
    outgoing: Rc<RefCell<Vec<Message>>>,
    flush: RefCell<Option<Timeout>>,
    flush_armed: Rc<Cell<bool>>,
    /// Posts what is queued when the page is hidden (`HIDDEN_EVENTS`): a page closed within the
    /// 0 ms wait never ran the timer, and the other tabs never heard of its last commit.
    on_hidden: RefCell<Option<Closure<dyn FnMut()>>>,
    /// This client was closed: what a step still committing announces is posted at once, and
    /// the channel stays open for it until the client is let go (`Drop`).
    left: Cell<bool>,
}

impl Tabs {
    pub fn new(name: &str, tab: String, jitter: f64) -> Tabs {
        Tabs {
            tab,
            name: name.to_string(),
            channel: web_sys::BroadcastChannel::new(&format!("kizuna:{name}")).ok(),
            on_message: RefCell::new(None),
            leading: Cell::new(false),
            leader: RefCell::new(None),
            last_heard: Cell::new(now() as f64),
            ping_sent: Cell::new(None),
            silence_ms: SILENCE_MS + jitter * SILENCE_JITTER_MS,
            lock: RefCell::new(None),
            heartbeat: RefCell::new(None),
            watchdog: RefCell::new(None),
            calls: RefCell::new(Vec::new()),
            next_call: Cell::new(0),
            leader_health: RefCell::new(None),
            inbox: RefCell::new(VecDeque::new()),
            draining: Cell::new(false),
            outgoing: Rc::new(RefCell::new(Vec::new())),
            flush: RefCell::new(None),
            flush_armed: Rc::new(Cell::new(false)),
            on_hidden: RefCell::new(None),
            left: Cell::new(false),
        }
    }

    /// True while this tab runs the sync loops.
    pub fn leading(&self) -> bool {
        self.leading.get()
    }

    pub fn leader_health(&self) -> Option<Value> {
        self.leader_health.borrow().clone()
    }

    /// Queues `message` for the other tabs (see `outgoing`).
    fn post(&self, message: Message) {
        let Some(channel) = &self.channel else { return };
        self.outgoing.borrow_mut().push(message);
        if self.left.get() {
            self.flush_now();
        } else if !self.flush_armed.replace(true) {
            let (outgoing, armed, channel) = (self.outgoing.clone(), self.flush_armed.clone(), channel.clone());
            *self.flush.borrow_mut() = Some(Timeout::new(0, move || {
                armed.set(false);
                post_all(&channel, &outgoing);
            }));
        }
    }

    /// Posts what is queued now (a tab that leaves).
    fn flush_now(&self) {
        self.flush.borrow_mut().take();
        self.flush_armed.set(false);
        if let Some(channel) = &self.channel {
            post_all(channel, &self.outgoing);
        }
    }

    /// Tells the other tabs that a step committed.
    pub fn announce(&self, version: f64, events: &[Event], health: Option<Value>) {
        self.post(Message::Commit { from: self.tab.clone(), version, events: events.to_vec(), health });
    }

    fn heard(&self, from: &str) {
        *self.leader.borrow_mut() = Some(from.to_string());
        self.last_heard.set(now() as f64);
        self.ping_sent.set(None);
    }
}

/// When a page may be about to go: `pagehide` as it is unloaded or put in the back-forward cache;
/// `visibilitychange` (dispatched at the document, seen by the window as it bubbles) as it is
/// hidden, after which a mobile browser may discard it without a `pagehide`. Posting early when it
/// shows again costs nothing.
const HIDDEN_EVENTS: [&str; 2] = ["pagehide", "visibilitychange"];

impl Drop for Tabs {
    fn drop(&mut self) {
        if let (Some(window), Some(on_hidden)) = (web_sys::window(), self.on_hidden.take()) {
            for event in HIDDEN_EVENTS {
                let _ = window.remove_event_listener_with_callback(event, on_hidden.as_ref().unchecked_ref());
            }
        }
        self.flush_now();
        if let Some(channel) = &self.channel {
            channel.close();
        }
    }
}

/// Posts each message as JSON text: the channel clones a string in one copy, where an object is
/// built by `JSON.parse` and then walked field by field, on every committing step.
fn post_all(channel: &web_sys::BroadcastChannel, outgoing: &RefCell<Vec<Message>>) {
    for message in std::mem::take(&mut *outgoing.borrow_mut()) {
        if let Ok(text) = serde_json::to_string(&message) {
            let _ = channel.post_message(&JsValue::from_str(&text));
        }
    }
}

/// A message as `post_all` posts it, or as an object (posted by a tab of an earlier version).
fn message_of(data: &JsValue) -> Option<Message> {
    match data.as_string() {
        Some(text) => kizuna_protocol::read_deep(&text).ok(),
        None => crate::js::decode(data).ok(),
    }
}

/// Joins the tabs of the client's database: listens on the channel, queues for the leader lock
/// and watches the leader.
pub fn join(inner: &Rc<Inner>) {
    let tabs = &inner.tabs;
    if let Some(channel) = &tabs.channel {
        let weak = Rc::downgrade(inner);
        let handler = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |event: web_sys::MessageEvent| {
            let Some(inner) = weak.upgrade() else { return };
            if let Some(message) = message_of(&event.data()) {
                receive(&inner, message);
            }
        });
        channel.set_onmessage(Some(handler.as_ref().unchecked_ref()));
        *tabs.on_message.borrow_mut() = Some(handler);
    }
    // A page's only: a worker is not hidden, and its last timers run while it lives.
    if let (Some(window), Some(_)) = (web_sys::window(), &tabs.channel) {
        let weak = Rc::downgrade(inner);
        let on_hidden = Closure::<dyn FnMut()>::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.tabs.flush_now();
            }
        });
        for event in HIDDEN_EVENTS {
            let _ = window.add_event_listener_with_callback(event, on_hidden.as_ref().unchecked_ref());
        }
        *tabs.on_hidden.borrow_mut() = Some(on_hidden);
    }
    queue_for_lock(inner, false);
    let weak = Rc::downgrade(inner);
    *tabs.watchdog.borrow_mut() = Some(Interval::new(WATCHDOG_MS, move || {
        if let Some(inner) = weak.upgrade() {
            watch_leader(&inner);
        }
    }));
}

/// Leaves: gives up the lock (the next tab in the queue leads at once), stops every timer and
/// refuses the calls still waiting for a leader.
pub fn leave(inner: &Inner) {
    let tabs = &inner.tabs;
    tabs.left.set(true);
    tabs.leading.set(false);
    tabs.heartbeat.borrow_mut().take();
    tabs.watchdog.borrow_mut().take();
    if let Some(mut lock) = tabs.lock.borrow_mut().take() {
        lock.give_up();
    }
    tabs.flush_now();
    // Not closed yet: a step whose transaction was open when the client closed still commits,
    // and the other tabs must hear of it (their live queries missed it otherwise).
    if let Some(channel) = &tabs.channel {
        channel.set_onmessage(None);
    }
    tabs.on_message.borrow_mut().take();
    for (_, call) in std::mem::take(&mut *tabs.calls.borrow_mut()) {
        call.settle(Err(ClientError::new("CLIENT_CLOSED", "this client was closed")));
    }
}

fn queue_for_lock(inner: &Rc<Inner>, steal: bool) {
    let (on_grant, on_loss) = (Rc::downgrade(inner), Rc::downgrade(inner));
    let lock = LeaderLock::request(
        &inner.tabs.name,
        steal,
        move || {
            if let Some(inner) = on_grant.upgrade() {
                spawn_local(async move { take_lead(&inner).await });
            }
        },
        move || {
            if let Some(inner) = on_loss.upgrade() {
                lose_lead(&inner);
            }
        },
    );
    // Replacing a queued request leaves the queue first.
    let previous = inner.tabs.lock.borrow_mut().replace(lock);
    drop(previous);
}

/// The lock was granted: name this tab in the `sync` record, then run the loops.
async fn take_lead(inner: &Rc<Inner>) {
    if inner.closed.get() {
        return;
    }
    let claimed = inner.claim_lead().await;
    // `close()` may have run while the claim was being written: it gave the lock up already, and a
    // closed client arms nothing (no heartbeat, no loops) and queues for nothing.
    if inner.closed.get() {
        return;
    }
    if let Err(e) = claimed {
        web_sys::console::error_1(&format!("kizuna: could not take the lead: {}: {}", e.code, e.message).into());
        // Not leading, so `lose_lead` would keep the lock this tab was granted: give it to the
        // next tab in the queue and wait behind it.
        queue_for_lock(inner, false);
        return;
    }
    let tabs = &inner.tabs;
    tabs.leading.set(true);
    tabs.heard(&tabs.tab.clone());
    tabs.post(Message::Leader { from: tabs.tab.clone() });
    scheduler::start(inner);
    let weak = Rc::downgrade(inner);
    *tabs.heartbeat.borrow_mut() = Some(Interval::new(HEARTBEAT_MS, move || {
        if let Some(inner) = weak.upgrade() {
            if inner.tabs.leading() {
                inner.tabs.post(Message::Heartbeat { from: inner.tabs.tab.clone(), health: inner.health_json() });
            }
        }
    }));
    // Calls made while no tab led, or handed to a leader that has gone: run them here.
    let waiting = std::mem::take(&mut *tabs.calls.borrow_mut());
    for (_, call) in waiting {
        let inner = inner.clone();
        spawn_local(async move {
            let outcome = run_call(&inner, &call.method).await;
            call.settle(outcome);
        });
    }
}

/// Another tab took the lead (or a step found another leader named): stop the loops and queue
/// for the lock again.
pub fn lose_lead(inner: &Rc<Inner>) {
    let tabs = &inner.tabs;
    let was_leading = tabs.leading.replace(false);
    tabs.heartbeat.borrow_mut().take();
    scheduler::stop(&inner.scheduler);
    if !inner.closed.get() && (was_leading || tabs.lock.borrow().is_none()) {
        tabs.last_heard.set(now() as f64);
        queue_for_lock(inner, false);
    }
}

/// A follower's watchdog: ping a silent leader, steal from one that does not answer.
fn watch_leader(inner: &Rc<Inner>) {
    let tabs = &inner.tabs;
    if inner.closed.get() || tabs.leading() {
        return;
    }
    let t = now() as f64;
    match tabs.ping_sent.get() {
        Some(sent) if t - sent > PONG_WAIT_MS => {
            tabs.ping_sent.set(None);
            tabs.last_heard.set(t);
            queue_for_lock(inner, true);
        }
        Some(_) => {}
        None if t - tabs.last_heard.get() > tabs.silence_ms => {
            tabs.ping_sent.set(Some(t));
            tabs.post(Message::Ping { from: tabs.tab.clone() });
        }
        None => {}
    }
}

fn receive(inner: &Rc<Inner>, message: Message) {
    let tabs = &inner.tabs;
    match message {
        Message::Heartbeat { from, health } => {
            tabs.heard(&from);
            *tabs.leader_health.borrow_mut() = Some(health);
        }
        Message::Leader { from } => {
            tabs.heard(&from);
            // Calls handed to the leader that went: the new one runs them.
            let calls: Vec<(u32, String)> = tabs.calls.borrow().iter().map(|(id, c)| (*id, c.method.clone())).collect();
            for (id, method) in calls {
                tabs.post(Message::Call { from: tabs.tab.clone(), id, method });
            }
        }
        Message::Ping { .. } => {
            if tabs.leading() {
                tabs.post(Message::Pong { from: tabs.tab.clone() });
            }
        }
        Message::Pong { from } => tabs.heard(&from),
        Message::Call { from, id, method } => {
            if tabs.leading() {
                let inner = inner.clone();
                spawn_local(async move {
                    let (ok, error) = match run_call(&inner, &method).await {
                        Ok(v) => (Some(v), None),
                        Err(e) => (None, Some(e.into())),
                    };
                    inner.tabs.post(Message::Answer { to: from, id, ok, error });
                });
            }
        }
        // In order behind the commits before it, so a follower's `sync()` resolves after its
        // state and events caught up with what the leader did.
        other => {
            tabs.inbox.borrow_mut().push_back(other);
            if !tabs.draining.replace(true) {
                let inner = inner.clone();
                spawn_local(async move { drain(&inner).await });
            }
        }
    }
}

/// Handles queued commits and answers one at a time, in the order they came.
async fn drain(inner: &Rc<Inner>) {
    loop {
        let next = inner.tabs.inbox.borrow_mut().pop_front();
        let Some(message) = next else { break };
        match message {
            Message::Commit { from, version, events, health } => {
                if let Some(health) = health {
                    inner.tabs.heard(&from);
                    *inner.tabs.leader_health.borrow_mut() = Some(health);
                }
                inner.catch_up(version).await;
                inner.deliver(&events);
                // Another tab's write: the leader pushes it.
                scheduler::arm(inner);
            }
            Message::Answer { to, id, ok, error } if to == inner.tabs.tab => {
                let mut calls = inner.tabs.calls.borrow_mut();
                let Some(at) = calls.iter().position(|(waiting, _)| *waiting == id) else { continue };
                let (_, call) = calls.remove(at);
                drop(calls);
                call.settle(match error {
                    None => Ok(ok.unwrap_or(Value::Null)),
                    Some(e) => Err(e.into()),
                });
            }
            _ => {}
        }
    }
    inner.tabs.draining.set(false);
}

async fn run_call(inner: &Rc<Inner>, method: &str) -> Result<Value, ClientError> {
    let outcome = match method {
        "sync" => inner.sync().await.map(|r| r.to_json()),
        _ => inner.pull().await.map(Value::Bool),
    };
    scheduler::arm(inner);
    outcome
}

/// A follower's `sync()` or `pull()`: handed to the leader, answered when it ran. Resolves with
/// the call's JSON result.
pub async fn forward(inner: &Rc<Inner>, method: &str) -> Result<JsValue, JsValue> {
    let tabs = &inner.tabs;
    let id = tabs.next_call.get() + 1;
    tabs.next_call.set(id);
    let mut settle = None;
    let answered = Promise::new(&mut |resolve, reject| settle = Some((resolve, reject)));
    let (resolve, reject) = settle.expect("the promise executor runs at once");
    tabs.calls.borrow_mut().push((id, PendingCall { method: method.to_string(), resolve, reject }));
    tabs.post(Message::Call { from: tabs.tab.clone(), id, method: method.to_string() });
    JsFuture::from(answered).await
}
