// The browser side of `make bench`: each figure of the client beside the limit measured in the
// same page and run (raw IndexedDB doing the same stores' work, plain fetch of the same pages).
import init, { KizunaClient } from "/pkg/kizunasync.js";

const wasm = await init();
const now = () => performance.now();
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const p99 = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(s.length * 0.99))]; };

async function token(sub) {
  const res = await fetch("/kizuna/v1/dev-token", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }) });
  return (await res.json()).token;
}
// A plain POST of `body` (JSON text) to the gateway's RPC `fn` with the caller's token: how the
// limits the client's requests are measured against reach the server.
const plainRpc = (jwt, fn, body) => fetch(`/rest/v1/rpc/${fn}`, {
  method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${jwt}` }, body });
const open = async (name, sub, extra = {}) => {
  const jwt = await token(sub);
  return KizunaClient.open({ name, url: location.origin, token: () => jwt, buckets: [`user:${sub}`], autoSync: false, ...extra });
};
const row = (i) => ({ id: `r${i}`, title: `row number ${i} with some words in it`, done: i % 2 === 0, position: i });

// A fetch for the client's `fetch` option that notes each request's path, when it began and when
// its answer's headers arrived, on the shared timeline, into `log`.
const timedFetch = (log) => (input, init) => {
  const began = performance.timeOrigin + now();
  const answer = fetch(input, init);
  answer.then(() => log.push([String(input.url ?? input).split("/").pop(), began, performance.timeOrigin + now()]), () => {});
  return answer;
};

// Raw IndexedDB with the client's two stores a write touches: rows (with a table index) and outbox.
function rawDb(name) {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open(name, 1);
    req.onupgradeneeded = () => {
      const db = req.result;
      db.createObjectStore("rows").createIndex("table", "table");
      db.createObjectStore("outbox");
    };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}
// The todos' records in raw IndexedDB, through the table index (the raw limit of a query).
const rawTableRows = (db) => new Promise((resolve, reject) => {
  const req = db.transaction("rows").objectStore("rows").index("table").getAll("todos");
  req.onsuccess = () => resolve(req.result);
  req.onerror = () => reject(req.error);
});
const done = (tx) => new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = tx.onabort = () => reject(tx.error); });
function rawPut(db, records) {
  const tx = db.transaction(["rows", "outbox"], "readwrite");
  for (const [i, r] of records) {
    tx.objectStore("rows").put({ table: "todos", pk: r.id, visible: r, base: null }, ["todos", r.id]);
    tx.objectStore("outbox").put({ seq: i, table: "todos", pk: r.id, op: "upsert", columns: r }, i);
  }
  return done(tx);
}

// The floor of the client's own design, in raw IndexedDB: the requests a write step makes, with
// records of the client's shapes, in one transaction over the client's five stores. The `sync`
// record (its stamp: did another tab commit?; the declared indexes) and each written key's row (an
// upsert assigns the columns it names over the stored row) are read; then the rows and the outbox
// entries are put, and the `sync` record, which carries the engine's `meta`, once the reads are
// answered. A step of fewer than 32 rows queues its rows' and entries' puts behind its reads
// without waiting for them (src/runner.rs, `write_unread`); a larger one waits, and asks first for
// the stored keys in the range of its keys, then reads those rows (src/row_reads.rs). The client's ratio to this floor is its own cost; the floor's ratio to
// rawPut is what its design adds to the two puts.
const STORES = ["rows", "outbox", "meta", "dead", "staging"];
function floorDb(name) {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open(name, 1);
    req.onupgradeneeded = () => { for (const s of STORES) req.result.createObjectStore(s); };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}
const asked = (req) => new Promise((resolve, reject) => { req.onsuccess = () => resolve(req.result); req.onerror = () => reject(req.error); });
async function floorWrite(db, records, version) {
  const tx = db.transaction(STORES, "readwrite");
  const rows = tx.objectStore("rows"), meta = tx.objectStore("meta");
  let unread = null;
  if (records.length >= 32) {
    const ids = records.map(([, r]) => r.id).sort();
    const [, stored] = await Promise.all([asked(meta.get("sync")),
      asked(rows.getAllKeys(IDBKeyRange.bound(["todos", ids[0]], ["todos", ids[ids.length - 1]]), 2 * ids.length + 1))]);
    await Promise.all(stored.map((key) => asked(rows.get(key))));
  } else {
    unread = Promise.all([asked(meta.get("sync")), ...records.map(([, r]) => asked(rows.get(["todos", r.id])))]);
  }
  const hlc = `${Date.now()}-0000-00000000-0000-4000-8000-000000000000`;
  for (const [i, r] of records) {
    rows.put({ table: "todos", pk: r.id, bucket: null, base: null, visible: r }, ["todos", r.id]);
    // As the client stores a fresh entry: the fields that hold their defaults left out.
    tx.objectStore("outbox").put({ seq: i, id: crypto.randomUUID(), table: "todos", pk: r.id, op: "upsert", columns: r, hlc, read_seq: 0,
      created_at: Date.now() }, i);
  }
  await unread;
  meta.put({ version, leader: "00000000-0000-4000-8000-000000000000", meta: { client_id: "00000000-0000-4000-8000-000000000000",
    next_seq: records.length + 1, checkpoint: { cursor: null, horizon: 0, committed_at: null, buckets: null },
    counters: { applied: 0, rejected: 0, skipped: 0, delayed: 0, dead_lettered: 0 }, hlc_last: hlc, slice_limit: null } }, "sync");
  return done(tx);
}

window.bench = {
  async localWrite(n) {
    const db = await rawDb(`raw-write-${crypto.randomUUID()}`);
    const raw = [];
    for (let i = 0; i < n; i++) { const t = now(); await rawPut(db, [[i, row(i)]]); raw.push(now() - t); }
    db.close();
    const floor = await floorDb(`floor-write-${crypto.randomUUID()}`);
    const floors = [];
    for (let i = 0; i < n; i++) { const t = now(); await floorWrite(floor, [[i, row(i)]], i); floors.push(now() - t); }
    floor.close();
    const client = await open(`kz-write-${crypto.randomUUID()}`, crypto.randomUUID());
    const kz = [];
    for (let i = 0; i < n; i++) { const t = now(); await client.put("todos", `r${i}`, row(i)); kz.push(now() - t); }
    client.close();
    // cross_origin_isolated: whether the clock had 5 µs steps (the gateway's --cross-origin-isolated) or 100 µs.
    return { kizuna_p50_ms: median(kz), raw_p50_ms: median(raw), ratio: median(kz) / median(raw),
             cross_origin_isolated: self.crossOriginIsolated, floor_p50_ms: median(floors), floor_ratio: median(kz) / median(floors), floor_to_raw: median(floors) / median(raw) };
  },

  // Five rounds, each the raw limit, the floor and the client in turn, each into a fresh database,
  // and the medians, after one round of each that is not counted: one batch of each moved the
  // ratio by a fifth from one run to the next (the raw limit alone 55 - 66 ms), and the first
  // rounds of a page run before the browser has compiled the hot code at its higher tier (in a
  // page of eight rounds: the client 149, 122, then 80 - 93 ms; the raw limit 164, 83, then 64 - 78).
  async batch(n, rounds = 5) {
    const raw = [], floors = [], kz = [];
    const records = Array.from({ length: n }, (_, i) => [i, row(i)]);
    for (let r = -1; r < rounds; r++) {
      const db = await rawDb(`raw-batch-${crypto.randomUUID()}`);
      let t = now();
      await rawPut(db, records);
      raw.push(now() - t);
      db.close();
      const floor = await floorDb(`floor-batch-${crypto.randomUUID()}`);
      t = now();
      await floorWrite(floor, records, 1);
      floors.push(now() - t);
      floor.close();
      const client = await open(`kz-batch-${crypto.randomUUID()}`, crypto.randomUUID());
      t = now();
      await client.batch(Array.from({ length: n }, (_, i) => ({ op: "upsert", table: "todos", pk: `r${i}`, row: row(i) })));
      kz.push(now() - t);
      // free(), not close(): a closed client keeps its copy of the outbox in wasm memory until its
      // JS object is collected, and six rounds of 1,000 pending writes held 10 MB of this page's
      // memory when the first sync's figure was read after them.
      client.free();
    }
    const [k, w, f] = [median(kz.slice(1)), median(raw.slice(1)), median(floors.slice(1))];
    return { rounds, kizuna_ms: k, raw_ms: w, ratio: k / w, floor_ms: f, floor_ratio: k / f, floor_to_raw: f / w };
  },

  // The first sync of `sub`'s rows; then the limits: plain fetch + JSON.parse of the same pages,
  // and raw IndexedDB puts of the same rows, one transaction per page.
  async initialSync(sub, limit) {
    const name = `kz-sync-${crypto.randomUUID()}`;
    const client = await open(name, sub, { pullLimit: limit });
    let t = now();
    await client.pull();
    const kz = now() - t;
    const memory = wasm.memory.buffer.byteLength;
    const count = (await client.list("todos")).length;
    let q = now();
    const scanned = await client.query("todos", { where: { done: false } });
    const scan = now() - q;
    client.close();
    // The same database opened with equality indexes declared: its rows are indexed once, at open.
    q = now();
    const indexed = await open(name, sub, { pullLimit: limit, indexes: { todos: ["done", "title"] } });
    const indexBuild = now() - q;
    q = now();
    const open_rows = await indexed.query("todos", { where: { done: false } });
    const query = now() - q;
    // Twenty lookups of one row each, by an indexed column: the median.
    const fewTimes = [];
    let few = [];
    for (let i = 0; i < 20; i++) {
      q = now();
      few = await indexed.query("todos", { where: { title: `bulk row ${1 + ((i * 7919) % 100000)}` } });
      fewTimes.push(now() - q);
    }
    const fewMs = median(fewTimes);
    // An ordered query with a limit: the ten open todos of highest position (no index orders it).
    q = now();
    const top = await indexed.query("todos", { where: { done: false }, orderBy: ["position", "desc"], limit: 10 });
    const topMs = now() - q;
    indexed.close();

    const jwt = await token(sub);
    const pages = [];
    let cursor = null;
    t = now();
    for (;;) {
      const res = await plainRpc(jwt, "kizuna_pull",
        JSON.stringify({ request: { protocol: 1, client_id: crypto.randomUUID(), cursor, buckets: [`user:${sub}`], limit } }));
      const page = await res.json();
      pages.push(page.entries);
      if (page.done) break;
      cursor = page.cursor;
    }
    const fetched = now() - t;
    const db = await rawDb(`raw-sync-${crypto.randomUUID()}`);
    t = now();
    let i = 0;
    for (const entries of pages) await rawPut(db, entries.map((e) => [i++, { id: e.pk, ...e.row }]));
    const raw = now() - t;
    // The raw limit of the query: the table index's getAll, filtered in JS.
    t = now();
    const all = await rawTableRows(db);
    const rawOpen = all.filter((r) => r.visible.done === false);
    const rawQuery = now() - t;
    // Its raw limit: the same getAll, filtered and sorted in JS.
    t = now();
    const allAgain = await rawTableRows(db);
    const rawTop = allAgain.filter((r) => r.visible.done === false).sort((a, b) => b.visible.position - a.visible.position).slice(0, 10);
    const rawTopMs = now() - t;
    db.close();
    // A figure of a wrong answer would measure nothing: the two must name the same rows.
    if (JSON.stringify(top.map((r) => r.id)) !== JSON.stringify(rawTop.map((r) => r.visible.id))) {
      throw new Error(`query_top: the client's ten rows differ from the raw sort's: ${top.map((r) => r.id)}`);
    }
    return {
      initial_sync: { rows: count, kizuna_ms: kz, raw_idb_ms: raw, fetch_ms: fetched, ratio: kz / raw, fetch_ratio: kz / fetched, wasm_memory_bytes: memory },
      query: { matches: open_rows.length, raw_matches: rawOpen.length, kizuna_ms: query, raw_ms: rawQuery, ratio: query / rawQuery,
               scan_ms: scan, scan_matches: scanned.length, index_build_ms: indexBuild },
      query_few: { matches: few.length, ms: fewMs },
      query_top: { matches: top.length, kizuna_ms: topMs, raw_ms: rawTopMs, ratio: topMs / rawTopMs },
    };
  },

  // A first sync alone in its page: what wasm memory it leaves (wasm memory never shrinks, so
  // this is also the most it used).
  async syncMemory(sub, limit) {
    const client = await open(`kz-mem-${crypto.randomUUID()}`, sub, { pullLimit: limit });
    const t = now();
    await client.pull();
    const ms = now() - t;
    const synced = wasm.memory.buffer.byteLength;
    const rows = (await client.list("todos")).length;
    client.close();
    return { rows, ms, wasm_memory_bytes: synced, after_listing_bytes: wasm.memory.buffer.byteLength };
  },

  async openPending(n) {
    const name = `kz-pending-${crypto.randomUUID()}`, sub = crypto.randomUUID();
    let client = await open(name, sub);
    for (let i = 0; i < n; i += 1000) {
      await client.batch(Array.from({ length: Math.min(1000, n - i) }, (_, j) => ({ op: "upsert", table: "todos", pk: `r${i + j}`, row: row(i + j) })));
    }
    client.close();
    const t = now();
    client = await open(name, sub);
    const ms = now() - t;
    const pending = client.pendingWrites().length;
    client.close();
    return { open_pending: { writes: pending, ms } };
  },

  // push.http_ratio: `sync()` pushing n queued lone writes (the client's own slices, 256 by
  // default) against plain `fetch` of the same request bodies to the gateway, one after another,
  // each answer parsed. The client's fetch is wrapped to keep its push bodies and to see when its
  // pull begins: the push is over then (sync() pulls after pushing). The limit's bodies are the
  // client's with fresh mutation ids, client id and keys, so the server does the same work.
  async pushHttp(n) {
    const sub = crypto.randomUUID(), jwt = await token(sub);
    const bodies = [];
    // The client's own time: while no push of its waits for an answer's status (two may overlap:
    // the next slice goes once the previous answer's status arrived).
    // Split as before the first request, between requests, and after the last answer's status.
    let pullStarted = null, waiting = 0, idleSince = null, idle = 0, idleFirst = 0;
    const recording = (url, init) => {
      if (String(url).endsWith("/kizuna_push")) {
        bodies.push(init.body);
        if (waiting++ === 0 && idleSince !== null) {
          idle += now() - idleSince;
          if (bodies.length === 1) idleFirst = idle;
        }
        const answer = fetch(url, init);
        const settled = () => { if (--waiting === 0) idleSince = now(); };
        answer.then(settled, settled);
        return answer;
      }
      if (pullStarted === null && String(url).endsWith("/kizuna_pull")) pullStarted = now();
      return fetch(url, init);
    };
    const client = await KizunaClient.open({ name: `kz-push-${crypto.randomUUID()}`, url: location.origin, token: () => jwt,
                                             buckets: [`user:${sub}`], autoSync: false, fetch: recording });
    let rejected = 0;
    client.on("rejected", () => { rejected += 1; });
    const key = (i) => `p${sub.slice(0, 8)}-${i}`;
    for (let i = 0; i < n; i += 250) {
      await Promise.all(Array.from({ length: Math.min(250, n - i) }, (_, j) => client.put("todos", key(i + j), { ...row(i + j), id: key(i + j) })));
    }
    const queued = client.pendingWrites().length;
    const t = now();
    idleSince = t;
    await client.sync();
    const kz = (pullStarted ?? now()) - t;
    const idleLast = idleSince !== null && waiting === 0 ? (pullStarted ?? now()) - idleSince : 0;
    idle += idleLast;
    const left = client.pendingWrites().length, dead = client.deadLetters().length;
    client.close();
    if (queued !== n || left !== 0 || dead !== 0 || rejected !== 0) {
      throw new Error(`push bench: ${queued} queued, ${left} left, ${dead} dead letters, ${rejected} rejected`);
    }

    const clientId = crypto.randomUUID();
    const again = bodies.map((b) => {
      const body = JSON.parse(b);
      body.request.client_id = clientId;
      for (const m of body.request.mutations) {
        m.id = crypto.randomUUID();
        m.pk = `f${m.pk.slice(1)}`;
        if (m.columns?.id !== undefined) m.columns.id = m.pk;
      }
      return JSON.stringify(body);
    });
    let applied = 0;
    const f = now();
    for (const body of again) {
      const res = await plainRpc(jwt, "kizuna_push", body);
      const answer = await res.json();
      applied += answer.verdicts.filter((v) => v.status === "APPLIED").length;
    }
    const fetched = now() - f;
    if (applied !== n) throw new Error(`push bench: plain fetch applied ${applied} of ${n}`);
    // client_ms: the client's own time between its requests (IndexedDB, wasm), not waiting for answers.
    return { writes: n, requests: bodies.length, kizuna_ms: kz, fetch_ms: fetched, writes_per_s: n / (kz / 1000),
             client_ms: idle, client_first_ms: idleFirst, client_between_ms: idle - idleFirst - idleLast,
             client_last_ms: idleLast, http_ratio: kz / fetched };
  },

  // One device's write as another device's `change` event (wake stream on): timestamps on the
  // shared performance timeline (both pages run in one browser process). Each device's requests
  // are timed too (`window.requests`), so the latency can be told apart into A's push, B's pull
  // and B's commit.
  async listen(sub) {
    window.heard = [];
    window.requests = [];
    window.listener = await open(`kz-wake-b-${crypto.randomUUID()}`, sub, { autoSync: true, fetch: timedFetch(window.requests) });
    window.listener.on("change", (e) => { if (e.origin === "remote") for (const k of e.keys) window.heard.push([k.pk, performance.timeOrigin + now()]); });
    await window.listener.sync();
  },
  async speak(sub, n) {
    window.requests = [];
    const client = await open(`kz-wake-a-${crypto.randomUUID()}`, sub, { autoSync: true, fetch: timedFetch(window.requests) });
    const sent = [];
    for (let i = 0; i < n; i++) {
      sent.push([`w-${sub}-${i}`, performance.timeOrigin + now()]);
      await client.put("todos", `w-${sub}-${i}`, { ...row(i), id: `w-${sub}-${i}` });
      await new Promise((r) => setTimeout(r, 250));
    }
    await new Promise((r) => setTimeout(r, 1000));
    client.close();
    return sent;
  },

  // The wake-up's floor on this host, measured right after it: the same steps with nothing of the
  // client's in them, in turn, n times, each part timed as the wake-up's are (run.mjs, wakeParts).
  // A's write as raw IndexedDB's two puts; A's push as a plain fetch of a one-row push (a device of
  // its own, a fresh row each time) until its answer's headers; B's pull as a plain fetch, sent
  // then, from B's checkpoint by a device of its own, until its headers: it brings that row and
  // closes its run (so its `served_to` is written, as B's is); B's commit as that answer's body
  // read and parsed, and raw IndexedDB's two puts again. No wake stream between push and pull.
  async wakeFloor(sub, n) {
    const jwt = await token(sub);
    const rpc = (fn, request) => plainRpc(jwt, fn, JSON.stringify({ request }));
    const read = async (res, fn) => {
      const text = await res.text();
      if (!res.ok) throw new Error(`wake floor: ${fn} answered ${res.status}: ${text.slice(0, 200)}`);
      return JSON.parse(text);
    };
    const pusher = crypto.randomUUID(), puller = crypto.randomUUID(), buckets = [`user:${sub}`];
    let cursor = null;
    for (let page = { done: false }; !page.done;) {
      page = await read(await rpc("kizuna_pull", { protocol: 1, client_id: puller, cursor, buckets, limit: 1000 }), "kizuna_pull");
      cursor = page.cursor;
    }
    const db = await rawDb(`raw-wake-${crypto.randomUUID()}`);
    const parts = { write: [], push: [], pull: [], commit: [], total: [] };
    for (let i = 0; i < n; i++) {
      const pk = `floor-${sub}-${i}`, r = { ...row(i), id: pk };
      const t0 = now();
      await rawPut(db, [[i, r]]);
      const t1 = now();
      const pushing = await rpc("kizuna_push", { protocol: 1, client_id: pusher, mutations: [{ id: crypto.randomUUID(), client_seq: i + 1,
        table: "todos", pk, op: "upsert", columns: r, read_seq: 0, hlc: `${Date.now()}-0000-floor` }] });
      const t2 = now();
      const pushed = read(pushing, "kizuna_push");
      const pulling = await rpc("kizuna_pull", { protocol: 1, client_id: puller, cursor, buckets, limit: 1000 });
      const t3 = now();
      const page = await read(pulling, "kizuna_pull");
      await rawPut(db, [[i, r]]);
      const t4 = now();
      const verdicts = (await pushed).verdicts;
      if (verdicts?.[0]?.status !== "APPLIED" || !page.done || page.entries.length !== 1) {
        throw new Error(`wake floor: round ${i} pushed ${JSON.stringify(verdicts)}, pulled ${page.entries.length} entries`);
      }
      cursor = page.cursor;
      parts.write.push(t1 - t0); parts.push.push(t2 - t1); parts.pull.push(t3 - t2); parts.commit.push(t4 - t3); parts.total.push(t4 - t0);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    db.close();
    return Object.fromEntries(Object.entries(parts).map(([k, xs]) => [`floor_${k}_p50_ms`, median(xs)]));
  },
};
window.stats = { median, p99 };
document.getElementById("state").textContent = "ready";
