//! The client core: feeds the engine its inputs (app writes, server answers, failures, the time)
//! and carries its outputs to IndexedDB, fetch and the app's listeners.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::{Rc, Weak};

use futures_util::future::LocalBoxFuture;
use futures_util::lock::Mutex;
use kizuna_engine::{Checkpoint, CommitPlan, Config, Engine, EngineError, Event, Failure, LocalWrite, PullStep, RowKey, RowRecord, StoreOp, Transaction};
use kizuna_protocol::{ErrorClass, PullRequest, PushRequest, PushResponse};
use serde_json::{json, Value};

use crate::error::ClientError;
use crate::events::{self, DeadLetterView, EntryView, SharedListeners};
use crate::pages::Pulled;
use crate::row_reads::RANGE_READ_MIN;
use crate::scheduler::Scheduler;
use crate::store::{Store, SyncStamp, WriteTxn};
use crate::tabs::{self, Tabs};
use crate::transport::{Answering, Transport};
use crate::watch::Watches;

/// An upper bound on pushes in one `sync()`: narrowing resends at once, and this guarantees the call
/// still ends if a server keeps answering in a way the engine has not seen.
const MAX_PUSHES_PER_SYNC: usize = 10_000;

pub fn now() -> i64 {
    js_sys::Date::now() as i64
}

pub struct Inner {
    pub store: Store,
    pub engine: RefCell<Engine>,
    pub config: Config,
    pub transport: Transport,
    pub listeners: SharedListeners,
    /// One sync activity (push loop or pull run) at a time, whether started by `sync()` or a timer.
    pub activity: Mutex<()>,
    pub closed: Cell<bool>,
    pub seed: Cell<u64>,
    /// The checkpoint as of the last commit that reached IndexedDB: what `getCheckpoint()` reports.
    /// The engine's own runs ahead while a commit is being written, and goes back if it fails.
    pub checkpoint: RefCell<Checkpoint>,
    /// The `sync` stamp the engine's state is as of (see `store.rs`).
    pub version: Cell<f64>,
    /// The leader the `sync` record named when this tab last read or wrote it: what a write taken
    /// unread puts back with the next version before it has read the record (`write_unread`).
    pub leader_named: RefCell<Option<String>>,
    /// Advances whenever the engine's state is replaced by what the store holds (`reloaded`): a
    /// write taken unread is settled only on the engine it was taken on.
    pub reloads: Cell<u64>,
    /// Writes whose step the engine has taken and the store has neither committed nor refused:
    /// their entries are not sent before they are durable (`poll_unwritten`).
    pub unsettled_writes: Cell<u32>,
    /// The other tabs of this database, and whether this one leads.
    pub tabs: Tabs,
    /// The loops' timers and streams (armed only while this tab leads).
    pub scheduler: Rc<Scheduler>,
    /// Live queries.
    pub watches: Watches,
    /// The options asked for the loops (`autoSync`, `realtimeWakeups`), used whenever this tab leads.
    pub auto_sync: bool,
    pub realtime_wakeups: bool,
    /// This client, for callbacks that need to own it.
    pub me: Weak<Inner>,
    /// How many records of unheard events this tab has kept: a part of their keys.
    pub unheard_kept: Cell<u64>,
    /// What the status getters answer once a closed client has let go of its engine (`let_go`).
    pub closed_views: RefCell<Option<ClosedViews>>,
}

/// The status getters' answers as JSON text in JS strings: held outside wasm memory, and parsed
/// into a fresh object on each call, as a live client's are built.
pub struct ClosedViews {
    pub status: js_sys::JsString,
    pub health: js_sys::JsString,
    pub pending: js_sys::JsString,
    pub dead: js_sys::JsString,
}

pub struct SyncReport {
    pub pushes: usize,
    pub push_error: Option<Failure>,
    pub pulled: bool,
}

impl SyncReport {
    pub fn to_json(&self) -> Value {
        json!({
            "pushes": self.pushes,
            "pulled": self.pulled,
            "pushError": self.push_error.as_ref().map(|f| json!({"code": f.code, "message": f.message, "status": f.status})),
        })
    }
}

pub fn failure_error(f: &Failure) -> ClientError {
    ClientError::new(&f.code, f.message.clone()).with_retryable(ErrorClass::of(f.status, Some(&f.code)).is_retryable())
}

/// Where a pull run goes after a page.
enum Flow {
    /// The next page, fetched while this one was staged.
    Next(Pulled),
    Committed,
    Abandoned,
}

/// What taking a page left to do (`Inner::take_page`).
enum Taken {
    /// Fetch this request's page next.
    Next(PullRequest),
    Flow(Flow),
}

impl Inner {
    /// The store refused a transaction after the engine had stepped: rebuild the engine from what
    /// is durable, so memory never runs ahead of IndexedDB, and hold requests back for a while, so
    /// a store that keeps refusing (a full disk, a record it cannot hold) does not turn into
    /// requests in a tight loop.
    async fn recover(&self, error: &ClientError) {
        let failures = self.engine.borrow().storage_failures() + 1;
        if let Ok((Some(state), stamp)) = self.store.load().await {
            let seed = self.seed.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
            self.seed.set(seed);
            *self.engine.borrow_mut() = Engine::new(self.config.clone(), state, seed);
            self.reloaded();
            self.settled_at(stamp.version);
        }
        let message = format!("{}: {}", error.code, error.message);
        self.engine.borrow_mut().after_storage_failure(now(), failures, message);
    }

    /// An answer (a push's verdicts, a pull page) whose step could not begin: the engine still
    /// waited for it (a push in flight, a run), so nothing was sent or fetched again in this tab
    /// until a reload. It is reloaded from the store, which lets the answer go: the slice goes
    /// again (the server answers it from its ledger), the run starts again. A tab that lost the
    /// lead leaves that to the new leader (`tabs::lose_lead`).
    async fn answer_not_taken(&self, error: ClientError) -> ClientError {
        if error.code != "NOT_LEADER" {
            self.recover(&error).await;
        }
        error
    }

    /// Begins a step's transaction and brings the engine up to what it finds: when another tab
    /// committed since this engine last looked, its state is reloaded in this same transaction, so
    /// the step builds on everything durable. A step only the leader may take (`leader_only`) is
    /// refused when the `sync` record names another leader: this tab was frozen or slow and lost
    /// the lead, and what it was about to do is the new leader's to do.
    pub async fn begin(&self, leader_only: bool) -> Result<WriteTxn<'_>, ClientError> {
        self.begin_reading(leader_only, &[]).await.map(|(txn, _)| txn)
    }

    /// `begin`, with the stored records of `keys` read in the same round trip.
    async fn begin_reading(&self, leader_only: bool, keys: &[RowKey]) -> Result<(WriteTxn<'_>, BTreeMap<RowKey, RowRecord>), ClientError> {
        let (txn, rows) = self.store.begin_reading(keys).await?;
        if leader_only && txn.stamp.leader.as_deref() != Some(self.tabs.tab.as_str()) {
            txn.abort();
            if let Some(me) = self.me.upgrade() {
                tabs::lose_lead(&me);
            }
            return Err(ClientError::new("NOT_LEADER", "another tab runs the sync loops of this database now").with_retryable(true));
        }
        self.leader_named.replace(txn.stamp.leader.clone());
        if txn.stamp.version != self.version.get() {
            if let Some(state) = txn.load_state().await? {
                self.engine.borrow_mut().adopt(state);
                self.reloaded();
            }
            self.settled_at(txn.stamp.version);
        }
        Ok((txn, rows))
    }

    /// The engine's state was replaced by what the store holds.
    fn reloaded(&self) {
        self.reloads.set(self.reloads.get() + 1);
    }

    /// The engine's state is now as of stamp `version`: what the getters report follows it.
    fn settled_at(&self, version: f64) {
        self.version.set(version);
        *self.checkpoint.borrow_mut() = self.engine.borrow().checkpoint().clone();
    }

    /// Another tab committed up to `version`: reload the engine's state (outside any step), so
    /// the synchronous getters and the events that follow see it.
    pub async fn catch_up(&self, version: f64) {
        if version <= self.version.get() {
            return;
        }
        if let Ok((Some(state), stamp)) = self.store.load().await {
            // A step of this tab may have committed a later stamp while the load ran.
            if stamp.version > self.version.get() {
                self.engine.borrow_mut().adopt(state);
                self.reloaded();
                self.settled_at(stamp.version);
            }
        }
    }

    /// Hands committed events to this tab's listeners and live queries.
    pub fn deliver(&self, events: &[Event]) {
        events::emit(&self.listeners, events);
        if let Some(me) = self.me.upgrade() {
            crate::watch::changed(&me, events);
        }
    }

    /// Names this tab the leader in the `sync` record: from this commit on, steps of the tab that
    /// led before are refused. Starts with nothing in flight and a pull due.
    /// Events a step kept and its tab never told (it went away as the step committed) are taken
    /// in the same transaction and told here and in every other tab.
    pub async fn claim_lead(&self) -> Result<(), ClientError> {
        let txn = self.begin(false).await?;
        let stamp = SyncStamp { version: txn.stamp.version + 1.0, leader: Some(self.tabs.tab.clone()) };
        let unheard = match txn.take_unheard().await {
            Ok(events) => events,
            Err(e) => {
                txn.abort();
                return Err(e);
            }
        };
        txn.put_stamp(&stamp);
        txn.commit().await?;
        self.version.set(stamp.version);
        self.leader_named.replace(stamp.leader);
        self.engine.borrow_mut().take_over();
        self.tell_unheard(stamp.version, unheard);
        Ok(())
    }

    /// Tells events a page kept and never told (it went away as their step committed), taken by
    /// this tab as it opened or took the lead: to its listeners (held for the first one of each
    /// name, see `events::replay`) and to the other tabs, as of stamp `version`.
    pub fn tell_unheard(&self, version: f64, unheard: Vec<Event>) {
        if !unheard.is_empty() {
            self.tabs.announce(version, &unheard, None);
            events::replay(&self.listeners, unheard);
        }
    }

    /// `status()`: the status counters.
    pub fn status_json(&self) -> Value {
        let s = self.engine.borrow().status();
        json!({
            "pending": s.pending, "retrying": s.retrying, "deadLetters": s.dead_letters,
            "applied": s.applied, "rejected": s.rejected, "skipped": s.skipped, "delayed": s.delayed,
        })
    }

    /// `pendingWrites()` as JSON text: the outbox, oldest first.
    pub fn pending_text(&self) -> String {
        let engine = self.engine.borrow();
        let entries: Vec<EntryView> = engine.outbox().map(EntryView).collect();
        serde_json::to_string(&entries).unwrap_or_else(|_| "[]".into())
    }

    /// `deadLetters()` as JSON text.
    pub fn dead_text(&self) -> String {
        let engine = self.engine.borrow();
        let dead: Vec<DeadLetterView> = engine.dead_letters().iter().map(DeadLetterView).collect();
        serde_json::to_string(&dead).unwrap_or_else(|_| "[]".into())
    }

    /// A closed client, once no step of it is running (`Store::when_idle`): what the status getters
    /// answer is kept as text in JS strings, and the engine (the outbox's copy, the pending writes'
    /// rows) is let go. Wasm memory never shrinks and the browser's collector does not see it, so a
    /// closed client whose object the app keeps held it all: 2 MB for 1,000 pending writes.
    pub fn let_go(&self) {
        let text = |t: String| js_sys::JsString::from(t);
        let views = ClosedViews {
            status: text(self.status_json().to_string()),
            health: text(self.health_json().to_string()),
            pending: text(self.pending_text()),
            dead: text(self.dead_text()),
        };
        *self.closed_views.borrow_mut() = Some(views);
        let client_id = self.engine.borrow().meta().client_id;
        *self.engine.borrow_mut() = Engine::new(self.config.clone(), Engine::fresh_state(client_id), self.seed.get());
        self.reloaded();
    }

    /// Sync health: the leader's own, or what a follower last heard from it.
    pub fn health_json(&self) -> Value {
        if !self.tabs.leading() {
            // Another tab's message, as it came: an object from a build of this client, anything from
            // other code on the channel (indexing a non-object would panic).
            if let Some(Value::Object(mut health)) = self.tabs.leader_health() {
                health.insert("leader".into(), Value::Bool(false));
                return Value::Object(health);
            }
        }
        let h = self.engine.borrow().health(now());
        json!({
            "failureStreak": h.failure_streak, "lastError": h.last_error, "lastSuccessAt": h.last_success_at,
            "inFlight": h.in_flight, "online": h.online, "leader": self.tabs.leading(),
        })
    }

    /// Persists what an engine step returned, advances the `sync` stamp, then emits its events
    /// here and tells the other tabs.
    /// The events that say what became of writes are kept with the commit until they are told
    /// (`WriteTxn::put_unheard`).
    async fn finish(&self, txn: WriteTxn<'_>, tx: &Transaction) -> Result<(), ClientError> {
        if let Err(e) = txn.apply(&tx.ops) {
            return Err(self.undo(txn, e).await);
        }
        if !tx.ops.is_empty() {
            txn.put_stamp(&txn.stamp.next());
        }
        self.seal(txn, tx).await
    }

    /// A step's operations could not be queued (after the engine stepped): its transaction is
    /// rolled back and the engine rebuilt from what is durable. Returns `error`.
    async fn undo(&self, txn: WriteTxn<'_>, error: ClientError) -> ClientError {
        txn.abort();
        self.recover(&error).await;
        error
    }

    /// `finish` once the step's own operations and, for a step that changed anything, the next
    /// stamp are queued: the kept events, the commit, then the events here and in the other tabs.
    async fn seal(&self, txn: WriteTxn<'_>, tx: &Transaction) -> Result<(), ClientError> {
        let stamp = txn.stamp.next();
        let changes = !tx.ops.is_empty();
        let lasting = events::lasting(&tx.events);
        let kept = (!lasting.is_empty()).then(|| {
            let n = self.unheard_kept.get() + 1;
            self.unheard_kept.set(n);
            format!("{:016}:{}:{n:08}", stamp.version as u64, self.tabs.tab)
        });
        let written = match kept.as_ref().map_or(Ok(()), |key| txn.put_unheard(key, lasting)) {
            Ok(()) => txn.commit().await,
            Err(e) => {
                txn.abort();
                Err(e)
            }
        };
        if let Err(e) = written {
            self.recover(&e).await;
            return Err(e);
        }
        self.settled_at(if changes { stamp.version } else { self.version.get() });
        if changes {
            self.leader_named.replace(stamp.leader);
        }
        self.deliver(&tx.events);
        if !tx.is_empty() {
            let health = self.tabs.leading().then(|| self.health_json());
            self.tabs.announce(self.version.get(), &tx.events, health);
        }
        if let (Some(key), Some(me)) = (kept, self.me.upgrade()) {
            // Told: drop the record in a transaction of its own, not awaited (a failure leaves it
            // for the next leader, which tells these events again).
            wasm_bindgen_futures::spawn_local(async move {
                let _ = me.store.forget_unheard(&key).await;
            });
        }
        Ok(())
    }

    /// Runs one engine step inside one store transaction: reads the rows of `keys`, steps the
    /// engine, writes what it returned. A refused step writes nothing and leaves the engine as it was.
    async fn step<R>(
        &self,
        leader_only: bool,
        keys: &[RowKey],
        f: impl FnOnce(&mut Engine, &BTreeMap<RowKey, RowRecord>) -> Result<(Transaction, R), EngineError>,
    ) -> Result<R, ClientError> {
        let (txn, current) = self.begin_reading(leader_only, keys).await?;
        let stepped = f(&mut self.engine.borrow_mut(), &current);
        self.conclude(txn, stepped).await
    }

    /// Writes what a step returned in its transaction, or, when the engine refused it, writes nothing.
    async fn conclude<R>(&self, txn: WriteTxn<'_>, stepped: Result<(Transaction, R), EngineError>) -> Result<R, ClientError> {
        match stepped {
            Ok((tx, r)) => {
                self.finish(txn, &tx).await?;
                Ok(r)
            }
            Err(e) => {
                txn.abort();
                Err(e.into())
            }
        }
    }

    /// `step` for a step that recomputes the rows of `keys` (a push's answer or failure, a dead
    /// letter): the engine must hold their records. It holds every row it touched since it last
    /// loaded, and those are not read again; the others (after a reload, or after another tab's
    /// commit made it reload) are read in the step's own transaction first.
    async fn settling_step<R>(
        &self,
        leader_only: bool,
        keys: &[RowKey],
        f: impl FnOnce(&mut Engine) -> Result<(Transaction, R), EngineError>,
    ) -> Result<R, ClientError> {
        let txn = self.begin_settling(leader_only, keys).await?;
        let stepped = f(&mut self.engine.borrow_mut());
        self.conclude(txn, stepped).await
    }

    /// The transaction of a step that settles `keys`, with their records in the engine.
    async fn begin_settling(&self, leader_only: bool, keys: &[RowKey]) -> Result<WriteTxn<'_>, ClientError> {
        let (txn, _) = self.begin_reading(leader_only, &[]).await?;
        let missing: Vec<RowKey> = {
            let engine = self.engine.borrow();
            keys.iter().filter(|k| !engine.holds_row(k)).cloned().collect()
        };
        if !missing.is_empty() {
            match txn.rows(&missing).await {
                Ok(found) => self.engine.borrow_mut().remember(&missing, &found),
                Err(e) => {
                    txn.abort();
                    return Err(e);
                }
            }
        }
        Ok(txn)
    }

    pub async fn write(&self, writes: Vec<LocalWrite>) -> Result<(), ClientError> {
        let keys: Vec<RowKey> = writes.iter().map(|w| RowKey::new(w.table.clone(), w.pk.clone())).collect();
        let t = now();
        let _unsettled = Unsettled::count(&self.unsettled_writes);
        // Taken unread only on an engine no open step may yet roll back, and for a few keys:
        // a larger step reads its keys as a range first (`row_reads`), whose second reads would
        // come after its own puts.
        if keys.len() < RANGE_READ_MIN && !self.store.busy() && self.write_unread(t, &keys, writes.clone()).await? {
            return Ok(());
        }
        self.step(false, &keys, |engine, current| Ok((engine.write(t, writes, current)?, ()))).await
    }

    /// A write step that does not wait for its reads: one round trip of IndexedDB is a third of a
    /// small write's time (the client's requests in raw IndexedDB in Chromium: 1.0 – 1.2 ms read
    /// first, 0.85 ms queued behind the reads). The step is taken on the engine as it stands, as
    /// though no key had a stored record beyond the rows the engine holds, and its puts are queued
    /// behind the reads of the `sync` record (the stamp and the declared indexes) and the keys'
    /// records, in one transaction. Their answers then settle it before it commits: a key found
    /// stored has its record made over what is stored and put again (`Engine::settle_unread`), a
    /// new declaration of indexes puts the records again with its tokens, and a stamp another tab
    /// moved rolls the transaction back, to be stepped again over what that tab wrote (`false`;
    /// the engine is reloaded then). The `sync` record is put as the step commits, over what the
    /// read found.
    async fn write_unread(&self, t: i64, keys: &[RowKey], writes: Vec<LocalWrite>) -> Result<bool, ClientError> {
        let mut txn = self.store.begin_unread()?;
        let reads = txn.issue_reads(keys)?;
        let reloads = self.reloads.get();
        let stepped = self.engine.borrow_mut().write(t, writes, &BTreeMap::new());
        let tx = match stepped {
            Ok(tx) => tx,
            Err(e) => {
                txn.abort();
                return Err(e.into());
            }
        };
        let known = self.version.get();
        let answered = match txn.apply(&tx.ops) {
            Ok(()) => reads.answered(&self.store).await,
            Err(e) => Err(e),
        };
        let answered = match answered.and_then(|answered| txn.found(answered.record.clone()).map(|()| answered)) {
            Ok(answered) => answered,
            Err(e) => return Err(self.undo(txn, e).await),
        };
        if txn.stamp.version != known || self.reloads.get() != reloads {
            // The engine stepped over a state another tab has moved on from (the step taken again
            // finds the stamp moved and reloads it), or it was reloaded under the step (a failed
            // step's `recover` between the step and its answers): what it wrote is no longer there.
            txn.abort();
            return Ok(false);
        }
        let again = self.engine.borrow_mut().settle_unread(&tx, &answered.found, answered.indexes_changed);
        if let Err(e) = txn.apply(&again) {
            return Err(self.undo(txn, e).await);
        }
        txn.put_stamp(&txn.stamp.next());
        self.seal(txn, &tx).await?;
        Ok(true)
    }

    pub async fn requeue_dead(&self, seq: i64) -> Result<(), ClientError> {
        let t = now();
        let keys = self.engine.borrow().dead_group_keys(seq);
        self.settling_step(false, &keys, |engine| Ok((engine.requeue_dead(t, seq)?, ()))).await
    }

    pub async fn discard_dead(&self, seq: i64) -> Result<(), ClientError> {
        let keys = self.engine.borrow().dead_group_keys(seq);
        self.settling_step(false, &keys, |engine| Ok((engine.discard_dead(seq)?, ()))).await
    }

    /// Sends the next due slice, if any, after a step that writes what must be durable before it
    /// goes (see `Engine::poll_push`); returns its answer once its status arrived. With `settle`,
    /// that step runs even when it writes nothing, so the slice holds every write any tab
    /// committed before (`sync()`).
    async fn send_next(&self, settle: bool) -> Result<Option<Result<Answering, Failure>>, ClientError> {
        let t = now();
        let unwritten = if settle { None } else { self.poll_unwritten(t) };
        let request = match unwritten {
            Some(request) => Some(request),
            None => {
                self.step(true, &[], |engine, _| {
                    Ok(match engine.poll_push(t) {
                        Some((request, tx)) => (tx, Some(request)),
                        None => (Transaction::default(), None),
                    })
                })
                .await?
            }
        };
        Ok(match request {
            Some(request) => Some(self.transport.push_answering(&request).await),
            None => None,
        })
    }

    /// The next slice, when this tab leads and sending it writes nothing first
    /// (`Engine::poll_push_unwritten`): it needs no store transaction before it goes. A tab
    /// that lost the lead without hearing of it yet sends at most one slice the new leader also
    /// sends; the server answers the second from its ledger, and this tab's step for the answer is
    /// refused (`begin`). Without it the push of a lone write, on the path of every wake-up of
    /// another device, waited for a store transaction that wrote nothing.
    fn poll_unwritten(&self, t: i64) -> Option<PushRequest> {
        self.may_send_unwritten().then(|| self.engine.borrow_mut().poll_push_unwritten(t)).flatten()
    }

    /// The slice to send ahead of `answering` (`Engine::poll_push_ahead`): only once its status
    /// says success, while `push_all` may send more, and on the same terms as `poll_unwritten`.
    fn poll_ahead(&self, answering: &Result<Answering, Failure>, may_send: bool) -> Option<PushRequest> {
        let succeeded = matches!(answering, Ok(a) if a.succeeded());
        (succeeded && may_send && self.may_send_unwritten()).then(|| self.engine.borrow_mut().poll_push_ahead(now())).flatten()
    }

    /// Whether a slice may go with no store transaction first: this tab leads, and no write of its
    /// own is still being written (a write whose step may yet be rolled back must not reach the
    /// server).
    fn may_send_unwritten(&self) -> bool {
        self.tabs.leading() && self.unsettled_writes.get() == 0
    }

    /// Pushes until nothing is due (`settle`: see `send_next`). Returns the number of requests
    /// answered and the first failure.
    ///
    /// The next slice goes as soon as an answer's status says success, before its body is read:
    /// the writes it answers for are committed then, so the server still receives every write in
    /// issue order, and it works on the next slice while this tab reads the answer and writes it
    /// down. Otherwise (a failure, a slice that must write first), it goes once nothing needs
    /// writing before it, beside the previous answer's step, or after that step.
    async fn push_all(&self, settle: bool) -> Result<(usize, Option<(Failure, ErrorClass)>), ClientError> {
        let mut answered = 0;
        let mut first_failure = None;
        let mut answering = self.send_next(settle).await?;
        let mut sent = usize::from(answering.is_some());
        let mut go_on = true;
        // The request after `this`, already on the wire (sent ahead of `this` being read).
        let mut following: Option<LocalBoxFuture<'_, Result<Answering, Failure>>> = None;
        while let Some(this) = answering.take() {
            if following.is_none() {
                following = self.start_push(self.poll_ahead(&this, go_on && sent < MAX_PUSHES_PER_SYNC)).await;
                sent += usize::from(following.is_some());
            }
            if let Some(next) = following.take() {
                // This answer is read and its step taken while the next request is on the wire.
                // Once that request's status arrives and this step is taken, the one after it goes
                // too, while this step is still being written: the server is kept busy whatever
                // an IndexedDB commit costs. `stepping` is held until the step is taken.
                let stepping = Mutex::new(());
                let step_taken = stepping.lock().await;
                let may_send = go_on && sent < MAX_PUSHES_PER_SYNC;
                let (after, taken) = futures_util::join!(
                    async {
                        let answer = next.await;
                        let _taken = stepping.lock().await;
                        let ahead = self.poll_ahead(&answer, may_send);
                        (answer, self.start_push(ahead).await)
                    },
                    async move {
                        let (txn, stepped, failure) = self.take_answer(Transport::push_answer(this).await).await?;
                        drop(step_taken);
                        self.conclude(txn, Ok((stepped, ()))).await?;
                        Ok::<_, ClientError>(failure)
                    }
                );
                // A step that could not be written reloaded the engine from the store, and a
                // failure lets the answer ahead go (`Engine::on_push_failure`): the answers on the
                // wire are dropped, and their writes, still queued, go again (the server answers
                // them from its ledger).
                let failure = taken?;
                let (next_answer, after_next) = after;
                sent += usize::from(after_next.is_some());
                let failed = failure.is_some();
                self.count_answer(failure, &mut answered, &mut first_failure, &mut go_on);
                if !failed {
                    answering = Some(next_answer);
                    following = after_next;
                } else if go_on && sent < MAX_PUSHES_PER_SYNC {
                    answering = self.send_next(false).await?;
                    sent += usize::from(answering.is_some());
                }
                continue;
            }
            let (txn, stepped, failure) = self.take_answer(Transport::push_answer(this).await).await?;
            self.count_answer(failure, &mut answered, &mut first_failure, &mut go_on);
            let more = go_on && sent < MAX_PUSHES_PER_SYNC;
            match if more { self.poll_unwritten(now()) } else { None } {
                Some(request) => {
                    sent += 1;
                    // The request is polled first, so it is on the wire before the step's writes
                    // are handed to IndexedDB (at once with a token provider that returns a
                    // string; one that returns a promise lets the writes go first).
                    let (next, written) = futures_util::join!(
                        self.transport.push_answering(&request),
                        self.conclude(txn, Ok((stepped, ())))
                    );
                    written?;
                    answering = Some(next);
                }
                None => {
                    self.conclude(txn, Ok((stepped, ()))).await?;
                    if more {
                        answering = self.send_next(false).await?;
                        sent += usize::from(answering.is_some());
                    }
                }
            }
        }
        Ok((answered, first_failure))
    }

    /// Sends `request`, if any: the request is on the wire when this returns (with a token
    /// provider that answers at once), and the answer's status is left to be awaited.
    async fn start_push(&self, request: Option<PushRequest>) -> Option<LocalBoxFuture<'_, Result<Answering, Failure>>> {
        let request = request?;
        let mut answering: LocalBoxFuture<'_, Result<Answering, Failure>> = Box::pin(async move { self.transport.push_answering(&request).await });
        Some(match futures_util::poll!(&mut answering) {
            std::task::Poll::Ready(answer) => Box::pin(std::future::ready(answer)),
            std::task::Poll::Pending => answering,
        })
    }

    /// An answer's (or a failure's) place in a `push_all`: answers counted, the first failure
    /// kept, and no more requests after a retryable failure.
    fn count_answer(&self, failure: Option<Failure>, answered: &mut usize, first_failure: &mut Option<(Failure, ErrorClass)>, go_on: &mut bool) {
        match failure {
            None => *answered += 1,
            Some(failure) => {
                let class = ErrorClass::of(failure.status, Some(&failure.code));
                *go_on &= !class.is_retryable();
                first_failure.get_or_insert((failure, class));
            }
        }
    }

    /// The step of a push's answer or failure, taken on the engine in its transaction (still to be
    /// concluded): the rows of the slice's keys are read first unless held, and those stored under
    /// the keys its verdicts respell (`Engine::respelled_keys`, asked once the step began: it may
    /// have reloaded the engine, which then holds no row). Returns the failure, if it was one.
    async fn take_answer(&self, answer: Result<PushResponse, Failure>) -> Result<(WriteTxn<'_>, Transaction, Option<Failure>), ClientError> {
        let keys = self.engine.borrow().in_flight_keys();
        let txn = match self.begin_settling(true, &keys).await {
            Ok(txn) => txn,
            Err(e) => return Err(self.answer_not_taken(e).await),
        };
        let respelled = match &answer {
            Ok(response) => self.engine.borrow().respelled_keys(response),
            Err(_) => Vec::new(),
        };
        if !respelled.is_empty() {
            match txn.rows(&respelled).await {
                Ok(found) => self.engine.borrow_mut().remember_respelled(&respelled, &found),
                Err(e) => {
                    txn.abort();
                    return Err(self.answer_not_taken(e).await);
                }
            }
        }
        let t = now();
        Ok(match answer {
            Ok(response) => {
                let stepped = self.engine.borrow_mut().on_push_response(t, response);
                (txn, stepped, None)
            }
            Err(failure) => {
                let stepped = self.engine.borrow_mut().on_push_failure(t, failure.clone());
                (txn, stepped, Some(failure))
            }
        })
    }

    /// One pull run from the committed cursor to its closing page. Returns false when no pull
    /// was due.
    pub async fn pull_run(&self) -> Result<bool, ClientError> {
        let Some(request) = self.engine.borrow_mut().poll_pull(now()) else { return Ok(false) };
        let mut page = self.fetch_page(self.transport.pull(&request).await).await?;
        loop {
            match self.feed_page(page).await? {
                Flow::Next(next) => page = next,
                Flow::Committed => return Ok(true),
                Flow::Abandoned => {
                    return Err(ClientError::new("PULL_ABANDONED", "the server sent a page that would move the checkpoint backwards; the run was abandoned and will be retried").with_retryable(true))
                }
            }
        }
    }

    /// A page's answer, or its failure handed to the engine (in a step of its own) and returned.
    async fn fetch_page(&self, answer: Result<Pulled, Failure>) -> Result<Pulled, ClientError> {
        match answer {
            Ok(page) => Ok(page),
            Err(failure) => {
                let t = now();
                let error = failure_error(&failure);
                self.step(true, &[], |engine, _| Ok((engine.on_pull_failure(t, failure), ()))).await?;
                Err(error)
            }
        }
    }

    /// Hands a page to the engine inside a store transaction. Pages before the closing one are
    /// staged, and the next page is fetched meanwhile, so the network and the store work at once:
    /// its request follows from this page's head (`Engine::next_page_request`), so it is sent
    /// before the step's transaction even begins, and its answer is used when the step asks for
    /// that same request. The closing page commits the whole run: the staged pages are read back
    /// in the same transaction that writes the rows, so the run lands at once or not at all and no
    /// transaction stays open across a network wait.
    async fn feed_page(&self, page: Pulled) -> Result<Flow, ClientError> {
        let ahead = self.engine.borrow().next_page_request(&page.head);
        let fetch_ahead = async {
            match &ahead {
                Some(request) => Some(self.transport.pull(request).await),
                None => None,
            }
        };
        let (taken, fetched) = futures_util::future::join(self.take_page(page), fetch_ahead).await;
        match taken? {
            Taken::Next(next) => {
                let answer = match fetched {
                    Some(answer) if ahead.as_ref() == Some(&next) => answer,
                    _ => self.transport.pull(&next).await,
                };
                Ok(Flow::Next(self.fetch_page(answer).await?))
            }
            Taken::Flow(flow) => Ok(flow),
        }
    }

    /// `feed_page`'s step: the page staged (and the request of the next one), or where the run went.
    async fn take_page(&self, page: Pulled) -> Result<Taken, ClientError> {
        let txn = match self.begin(true).await {
            Ok(txn) => txn,
            Err(e) => return Err(self.answer_not_taken(e).await),
        };
        let step = self.engine.borrow_mut().on_pull_page_text(now(), page.head, page.text);
        let planned = match step {
            PullStep::Stage { tx, next } | PullStep::Restart { tx, next } => Ok((tx, Taken::Next(next))),
            PullStep::Abandoned { tx } => Ok((tx, Taken::Flow(Flow::Abandoned))),
            PullStep::Commit(plan) => self.write_run(&txn, plan).await.map(|tx| (tx, Taken::Flow(Flow::Committed))),
        };
        match planned {
            Ok((tx, taken)) => {
                self.finish(txn, &tx).await?;
                Ok(taken)
            }
            // The engine already moved on to this page: roll both back to what is durable.
            Err(e) => Err(self.undo(txn, e).await),
        }
    }

    /// Writes a closing run into `txn`: the staged pages read back one at a time, then the closing
    /// page's entries the same way, then the checkpoint and the staging cleanup from the plan.
    async fn write_run(&self, txn: &WriteTxn<'_>, mut plan: CommitPlan) -> Result<Transaction, ClientError> {
        if plan.rehydrate() {
            // The rows of pending writes are kept through the rehydrate: read them before they go.
            let keys = self.engine.borrow().tracked_keys();
            let found = txn.rows(&keys).await?;
            self.engine.borrow_mut().remember(&keys, &found);
            txn.apply(&[StoreOp::ClearRows])?;
        }
        for page_no in 0..plan.staged_pages() {
            txn.write_staged(&mut plan, page_no).await?;
        }
        if let Some(text) = plan.take_closing_text() {
            txn.write_page(&mut plan, &text)?;
        }
        Ok(plan.finish(&mut self.engine.borrow_mut(), now()))
    }

    /// `sync()`: push what is due, then pull to the next checkpoint. A refused write never holds
    /// remote rows back, so a permanent push failure still pulls; a retryable one (network, session)
    /// would fail the pull the same way, so the call reports it instead.
    pub async fn sync(&self) -> Result<SyncReport, ClientError> {
        let _turn = self.activity.lock().await;
        if !self.engine.borrow().is_online() {
            return Err(ClientError::new("OFFLINE", "the browser reports no network; writes wait in the outbox").with_retryable(true));
        }
        self.engine.borrow_mut().request_push();
        let (pushes, failure) = self.push_all(true).await?;
        if let Some((f, class)) = &failure {
            if class.is_retryable() {
                return Err(failure_error(f));
            }
        }
        self.engine.borrow_mut().request_pull();
        let pulled = self.pull_run().await?;
        Ok(SyncReport { pushes, push_error: failure.map(|(f, _)| f), pulled })
    }

    /// `pull()`: one pull run now, whatever the push side is doing.
    pub async fn pull(&self) -> Result<bool, ClientError> {
        let _turn = self.activity.lock().await;
        self.engine.borrow_mut().request_pull();
        self.pull_run().await
    }

    /// A timer fired: do whatever the engine says is due. Failures are already events. Returns
    /// false when another activity was running: it re-arms the timer itself when it ends, so the
    /// caller must not (the timer would fire again at once, over and over, until it does).
    pub async fn tick(&self) -> bool {
        let Some(_turn) = self.activity.try_lock() else { return false };
        if !self.closed.get() && self.tabs.leading() {
            // A timer that fired for a pull (a wake-up) goes straight to it: asking the engine for
            // a slice costs a store transaction, on the path of every remote change.
            if self.engine.borrow().push_due(now()) {
                let _ = self.push_all(false).await;
            }
            let _ = self.pull_run().await;
        }
        true
    }
}

/// Counts a write as unsettled (`Inner::unsettled_writes`) for as long as it lives, however the
/// write ends.
struct Unsettled<'a>(&'a Cell<u32>);

impl<'a> Unsettled<'a> {
    fn count(writes: &'a Cell<u32>) -> Unsettled<'a> {
        writes.set(writes.get() + 1);
        Unsettled(writes)
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}
