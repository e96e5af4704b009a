// One device of the demo: a Kizuna client on its own local database, signed in as one person,
// with its own network switch. It keeps what the views show (each list's rows through a live
// query, the conflicts and progress it heard) and offers the actions a person takes.
import { KizunaClient } from "/pkg/kizunasync.js";
import { LISTS, ARCHIVE, bucketOf, person } from "./team.js";
import { simulatedNetwork } from "./network.js";
import { sessionFor } from "./session.js";
import { Feed } from "./feed.js";

export const TABLE = "board_cards";
const EVENTS = ["change", "applied", "rejected", "deadLetter", "pushFailed", "pullFailed", "pullProgress",
  "checkpoint", "conflicts", "checkpointExpired", "serverReset", "rehydrated"];

const byPosition = (a, b) => (a.position ?? 0) - (b.position ?? 0) || String(a.id).localeCompare(String(b.id));

export class Device {
  constructor(slot, label, defaultUser) {
    this.slot = slot;
    this.label = label;
    this.network = simulatedNetwork(slot);
    this.user = localStorage.getItem(this.key("user")) ?? defaultUser;
    this.archive = localStorage.getItem(this.key("archive")) === "1";
    this.client = null;
    this.feed = new Feed();
    this.listeners = new Set();
    this.stops = [];
    this.opening = Promise.resolve();
    this.reset();
    this.network.onChange((offline) => {
      this.feed.note(offline ? "✈" : "⇅", offline ? "Offline: writes wait in the outbox" : "Online: pushing the outbox");
      if (!offline) this.syncNow();
      this.changed();
    });
    // Another tab of the page signed this device in as someone else, or joined or left the archive.
    window.addEventListener("storage", (event) => {
      if (event.key !== this.key("user") && event.key !== this.key("archive")) return;
      this.user = localStorage.getItem(this.key("user")) ?? defaultUser;
      this.archive = localStorage.getItem(this.key("archive")) === "1";
      this.open();
    });
  }

  key(what) { return `kizuna-demo:${this.slot}:${what}`; }

  reset() {
    this.buckets = new Map();       // list id -> the rows its bucket's live query gave
    this.lists = new Map();         // list id -> { rows (by position), byId }: cards by the list they name
    this.titles = new Map();        // card id -> the last title seen, to name cards that are gone
    this.conflicts = new Map();     // card id -> Map(column -> the latest conflict)
    this.progress = null;           // the last run of several pages: { pages, entries, total, done }
    this.spot = new Set();          // the cards a scenario is about: outlined and scrolled into view
  }

  /** The lists this device pulls. */
  get shownLists() { return this.archive ? [...LISTS, ARCHIVE] : LISTS; }
  get person() { return person(this.user); }

  /** (Re)opens the client for the current user and lists; calls run one after another. */
  open() {
    this.opening = this.opening.then(() => this.reopen()).catch((e) => this.feed.error(e));
    return this.opening;
  }

  async reopen() {
    this.closeClient();
    const who = this.person;
    const client = await KizunaClient.open({
      name: `kizuna-demo-${this.slot}-${who.key}`,
      url: location.origin,
      token: sessionFor(who.id, this.network),
      buckets: this.shownLists.map((l) => bucketOf(l.id)),
      fetch: this.network.fetch,
      // A missed wake-up (the wake stream reconnects 5 s after the network comes back) waits for
      // the scheduled pull: every 5 s here, so a reconnected device catches up within seconds.
      pullIntervalMs: 5_000,
      // Quicker than the defaults (1 s doubling to 60 s) so that a refused write's five tries
      // take seconds, not a minute, while a visitor watches.
      retryBaseMs: 500,
      retryMaxMs: 8_000,
    });
    this.client = client;
    this.feed.note("☺", `Signed in as ${who.name}, pulling ${this.shownLists.map((l) => l.name).join(", ")}`);
    for (const name of EVENTS) this.stops.push(client.on(name, (event) => this.heard(name, event)));
    // One live query per bucket, read through the bucket index, so a list of tens of thousands
    // of cards costs nothing to the others. Cards are grouped by the list they name: a card moved
    // here and not yet acknowledged is still in its old bucket's result.
    for (const list of this.shownLists) {
      this.stops.push(client.watch(TABLE, { bucket: bucketOf(list.id) }, (rows) => this.showBucket(list.id, rows)));
    }
    this.changed();
    this.syncNow();
  }

  closeClient() {
    for (const stop of this.stops.splice(0)) stop();
    this.client?.close();
    this.client = null;
    this.reset();
  }

  heard(name, event) {
    // A run of more than one page gets the progress bar; a one-page run is over as it starts.
    if (name === "pullProgress" && ((this.progress && !this.progress.done) || event.total === null || event.entries < event.total)) {
      this.progress = { ...event, done: event.total !== null && event.entries >= event.total };
    }
    if (name === "checkpoint" && this.progress) this.progress.done = true;
    if (name === "conflicts") {
      for (const c of event.conflicts) {
        if (!this.conflicts.has(c.pk)) this.conflicts.set(c.pk, new Map());
        this.conflicts.get(c.pk).set(c.column, c);
      }
    }
    if (name === "rejected" && event.mutation.columns?.title) this.titles.set(event.mutation.pk, String(event.mutation.columns.title));
    this.feed.heard(name, event);
    this.changed();
  }

  showBucket(list, rows) {
    this.buckets.set(list, rows);
    const grouped = new Map(this.shownLists.map((l) => [l.id, new Map()]));
    for (const bucketRows of this.buckets.values()) {
      for (const row of bucketRows) grouped.get(row.list)?.set(row.id, row);
    }
    for (const [id, byId] of grouped) {
      const rows = [...byId.values()].sort(byPosition);
      if (id !== ARCHIVE.id) for (const r of rows) this.titles.set(r.id, r.title);
      this.lists.set(id, { rows, byId });
    }
    this.changed();
  }

  card(id) {
    for (const { byId } of this.lists.values()) if (byId.has(id)) return byId.get(id);
    return null;
  }

  spotlight(ids) { this.spot = new Set(ids); this.changed(); }

  titleOf(id) { return this.card(id)?.title ?? this.titles.get(id) ?? null; }

  /** Views re-render soon after any change, once per burst. */
  changed() {
    if (this.scheduled) return;
    this.scheduled = setTimeout(() => {
      this.scheduled = null;
      for (const listener of this.listeners) listener();
    }, 0);
  }
  onChange(listener) { this.listeners.add(listener); return () => this.listeners.delete(listener); }

  /** Resolves once `check(this)` holds (checked at every change and every 100 ms). */
  waitFor(what, check, timeoutMs = 30_000) {
    return new Promise((resolve, reject) => {
      const started = Date.now();
      const test = () => {
        let ok = false;
        try { ok = check(this); } catch { ok = false; }
        if (ok) { stop(); clearInterval(timer); resolve(ok); }
        else if (Date.now() - started > timeoutMs) { stop(); clearInterval(timer); reject(new Error(`${this.label}: gave up waiting for ${what}`)); }
      };
      const stop = this.onChange(test);
      const timer = setInterval(test, 100);
      test();
    });
  }

  pending() { return this.client?.pendingWrites() ?? []; }
  deadLetters() { return this.client?.deadLetters() ?? []; }
  isPending(id) { return this.pending().some((w) => w.pk === id); }

  endOf(list) {
    const rows = this.lists.get(list)?.rows ?? [];
    return Math.max(Date.now(), ...rows.slice(-1).map((r) => (r.position ?? 0) + 1));
  }

  // What a person does. Each returns the client's promise: stored locally when it settles.
  async addCard(list, title) {
    const id = crypto.randomUUID();
    await this.client.put(TABLE, id, { id, list, title, notes: null, assignee: null, done: false, position: this.endOf(list) });
    return id;
  }
  edit(id, columns) { return this.client.patch(TABLE, id, columns); }
  move(id, list) { return this.client.patch(TABLE, id, { list, position: this.endOf(list) }); }
  remove(id) { return this.client.delete(TABLE, id); }
  requeue(seq) { return this.client.requeueDeadLetter(seq); }
  discard(seq) { return this.client.discardDeadLetter(seq); }

  /** Push and pull now; failures are in the feed already (pushFailed/pullFailed). */
  syncNow() {
    if (!this.client || this.network.isOffline()) return Promise.resolve(null);
    return this.client.sync().catch(() => null).finally(() => this.changed());
  }

  setOffline(offline) { this.network.setOffline(offline); }

  signIn(user) {
    this.user = user;
    localStorage.setItem(this.key("user"), user);
    return this.open();
  }

  setArchive(joined) {
    this.archive = joined;
    if (joined) localStorage.setItem(this.key("archive"), "1"); else localStorage.removeItem(this.key("archive"));
    return this.open();
  }

  /** Runs a person's action, reporting a failure in the feed instead of throwing. */
  attempt(promise) {
    return Promise.resolve(promise).catch((e) => this.feed.error(e)).finally(() => this.changed());
  }
}
