// One device of a history: the real client (the npm package) on the checker's tables, driven by
// driver.mjs. Every event the client emits is reported to the driver as it is heard, numbered in
// the order heard; a dead letter is discarded at once, as an app that gives up on it would.
const kizuna = await import("/pkg/kizunasync.js");
await kizuna.default();

const EVENTS = ["change", "applied", "rejected", "deadLetter", "pushFailed", "pullFailed", "pullProgress", "checkpoint", "conflicts", "checkpointExpired", "serverReset", "rehydrated"];
const TABLES = ["hist_items", "hist_notes"];
/** The events the checker judges, kept until the next page (see `open`). */
const KEPT = ["applied", "rejected", "deadLetter", "checkpoint"];

const errorOf = (e) => ({ code: e?.code ?? "THROWN", message: String(e?.message ?? e) });

window.harness = {
  ready: true,
  client: null,
  /** Events heard by this page so far. */
  n: 0,

  async open({ gen, name, url, token, buckets, options }) {
    this.gen = gen;
    this.client = await kizuna.KizunaClient.open({ name, url, token: async () => token, buckets, ...options });
    // What the client tells as it opens may be what the page before kept and did not tell
    // (decided under that page's buckets): such events are marked `early`.
    let early = true;
    for (const event of EVENTS) {
      this.client.on(event, (payload) => {
        const n = this.n++;
        window.kizunaReport(gen, n, event, payload, early);
        // A report still on its way to the driver when the page goes away (a reload) is lost with
        // it, though the client told it: what the checker judges is also kept in sessionStorage,
        // which the next page of this tab still holds, and the driver collects it from there.
        if (KEPT.includes(event)) {
          try { sessionStorage.setItem(`heard:${gen}:${n}`, JSON.stringify({ gen, n, name: event, payload, early })); } catch {}
        }
        if (event === "deadLetter") this.client.discardDeadLetter(payload.entry.seq).catch(() => {});
      });
    }
    await new Promise((r) => setTimeout(r, 0)); // the held events are told once `on` has returned
    early = false;
  },

  close() {
    this.client?.close();
    this.client = null;
  },

  /** Local writes as one call (several: one atomic batch), with the outbox before and after. */
  async write(writes) {
    const before = this.client.pendingWrites().map((e) => e.id);
    const heardBefore = this.n;
    let error = null;
    try {
      if (writes.length === 1) {
        const { op, table, pk, columns, options } = writes[0];
        if (op === "upsert") await this.client.put(table, pk, columns, options);
        else if (op === "patch") await this.client.patch(table, pk, columns, options);
        else await this.client.delete(table, pk, options);
      } else {
        await this.client.batch(writes.map(({ op, table, pk, columns }) =>
          op === "upsert" ? { op, table, pk, row: columns } : op === "patch" ? { op, table, pk, columns } : { op, table, pk }));
      }
    } catch (e) {
      error = errorOf(e);
    }
    return { error, before, after: this.client.pendingWrites(), heardBefore, heardAfter: this.n };
  },

  async sync() {
    try {
      await this.client.sync();
      return { error: null };
    } catch (e) {
      return { error: errorOf(e) };
    }
  },

  progress() {
    return { open: this.client.pendingWrites().length + this.client.deadLetters().length, horizon: this.client.getCheckpoint().horizon };
  },

  /**
   * Everything the device shows, at one moment: the checkpoint, the visible rows and the pending
   * writes, read again until no event arrived and no checkpoint committed while it read.
   */
  async read({ written = [] } = {}) {
    for (let attempt = 0; attempt < 100; attempt++) {
      const n = this.n;
      const { horizon, buckets } = this.client.getCheckpoint();
      const pending = this.client.pendingWrites();
      // A table's rows carry their keys in `id`, but a row that exists only as the device's own
      // patch (pending, or acknowledged and not yet pulled) holds just the columns it names: the
      // keys the device wrote (`written`, from the driver, across pages) are read by key.
      const keys = new Map([...written, ...pending].map(({ table, pk }) => [`${table}/${pk}`, { table, pk }]));
      const [tables, patched] = await Promise.all([
        Promise.all(TABLES.map((t) => this.client.list(t))),
        Promise.all([...keys].map(([name, { table, pk }]) => this.client.get(table, pk).then((row) => [name, row]))),
      ]);
      if (n === this.n && horizon === this.client.getCheckpoint().horizon) {
        const rows = {};
        tables.forEach((list, i) => { for (const row of list) if (row.id !== undefined) rows[`${TABLES[i]}/${row.id}`] = row; });
        for (const [key, row] of patched) if (row) rows[key] = row; else delete rows[key];
        return { gen: this.gen, n, horizon, buckets, rows, pending };
      }
    }
    throw new Error("no quiet moment to read in 100 tries");
  },
};
