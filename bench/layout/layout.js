// How the row store's layout bounds a first sync, in raw IndexedDB (no Kizuna): 100,000 rows of
// about 200 B, as the gateway's pages of 1,000 bring them, stored a transaction per page
//   A. one object record per row (the client's layout, and the bench's raw limit),
//   B. one record per row holding the row as JSON text (does the structured clone of objects cost?),
//   C. one record per page holding the page's text,
//   D. one record per chunk of 1,000 or 100 rows, with the chunk's keys in a multiEntry index, and
//      what a point read (the chunk holding a key, parsed) then costs beside A's;
// and JSON.parse of the pages alone. Figures in ms (point reads: per read).
const now = () => performance.now();
const row = (i) => ({ id: `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`, owner: "00000000-0000-4000-8000-000000000100",
  title: `row number ${i} with some words in it`, done: i % 2 === 0, position: i, note: null, updated_at: "2026-12-06T18:00:00.000000+00:00" });
const open = (name, setup) => new Promise((res, rej) => { const r = indexedDB.open(name, 1); r.onupgradeneeded = () => setup(r.result); r.onsuccess = () => res(r.result); r.onerror = () => rej(r.error); });
const done = (tx) => new Promise((res, rej) => { tx.oncomplete = res; tx.onerror = tx.onabort = () => rej(tx.error); });
const rowsStore = (db) => { const s = db.createObjectStore("rows"); s.createIndex("table", "table"); s.createIndex("bucket", "bucket"); };
async function pages(n, per) {
  // The page texts as a pull would have them: JSON arrays of rows.
  const out = [];
  for (let p = 0; p < n / per; p++) out.push(JSON.stringify(Array.from({ length: per }, (_, j) => row(p * per + j))));
  return out;
}
window.exp = {
  async run(n = 100000, per = 1000) {
    const texts = await pages(n, per);
    const results = {};
    // A: one object record per row (the client today, and the bench's raw limit); B: the same with
    // the row as its JSON text (structured clone then copies a string). Each read back whole.
    const perRow = async (name, record, row) => {
      const db = await open(`${name}-${crypto.randomUUID()}`, rowsStore);
      const t = now();
      for (const text of texts) {
        const tx = db.transaction("rows", "readwrite"), s = tx.objectStore("rows");
        for (const r of JSON.parse(text)) s.put({ table: "todos", pk: r.id, bucket: "user:x", ...record(r) }, ["todos", r.id]);
        await done(tx);
      }
      results[`${name}_ms`] = now() - t;
      const q = now();
      const all = await new Promise((res) => { const r = db.transaction("rows").objectStore("rows").index("table").getAll("todos"); r.onsuccess = () => res(r.result); });
      results[`${name}_read`] = all.map(row).length;
      results[`${name}_read_ms`] = now() - q;
      db.close();
    };
    await perRow("objects", (r) => ({ base: r }), (rec) => rec.base);
    await perRow("text", (r) => ({ text: JSON.stringify(r) }), (rec) => JSON.parse(rec.text));
    // C: one record per page of rows (the page's text), keyed by page.
    {
      const db = await open(`c-${crypto.randomUUID()}`, (d) => { const s = d.createObjectStore("chunks"); s.createIndex("table", "table"); });
      const t = now();
      for (let p = 0; p < texts.length; p++) {
        const tx = db.transaction("chunks", "readwrite");
        tx.objectStore("chunks").put({ table: "todos", bucket: "user:x", text: texts[p] }, ["todos", p]);
        await done(tx);
      }
      results.chunks_ms = now() - t;
      const q = now(); const all = await new Promise((res) => { const r = db.transaction("chunks").objectStore("chunks").index("table").getAll("todos"); r.onsuccess = () => res(r.result); });
      const parsed = all.flatMap((rec) => JSON.parse(rec.text));
      results.chunks_read_ms = now() - q; results.chunks_read = parsed.length;
      db.close();
    }
    // D: one record per page, with the page's keys in a multiEntry index (a row found by its key).
    for (const size of [1000, 100]) {
      const db = await open(`d-${crypto.randomUUID()}`, (d) => { const s = d.createObjectStore("chunks"); s.createIndex("table", "table"); s.createIndex("pk", "pks", { multiEntry: true }); });
      const chunks = [];
      for (const text of texts) { const rows = JSON.parse(text); for (let i = 0; i < rows.length; i += size) chunks.push(rows.slice(i, i + size)); }
      const t = now();
      for (let p = 0; p < chunks.length; p += 1000 / size) {
        const tx = db.transaction("chunks", "readwrite"), s = tx.objectStore("chunks");
        for (let c = p; c < p + 1000 / size; c++) s.put({ table: "todos", bucket: "user:x", pks: chunks[c].map((r) => r.id), text: JSON.stringify(chunks[c]) }, ["todos", c]);
        await done(tx);
      }
      results[`keyed_chunks_${size}_ms`] = now() - t;
      // A point read: the chunk holding a key, parsed, the row found.
      const q = now();
      for (let k = 0; k < 200; k++) {
        const id = row(Math.floor(Math.random() * n)).id;
        const rec = await new Promise((res) => { const r = db.transaction("chunks").objectStore("chunks").index("pk").get(id); r.onsuccess = () => res(r.result); });
        if (!JSON.parse(rec.text).find((r) => r.id === id)) throw new Error("not found");
      }
      results[`keyed_chunks_${size}_point_read_ms`] = (now() - q) / 200;
      db.close();
    }
    // A point read in A's layout, for comparison.
    {
      const db = await open(`a2-${crypto.randomUUID()}`, rowsStore);
      for (const text of texts.slice(0, 10)) { const tx = db.transaction("rows", "readwrite"), s = tx.objectStore("rows"); for (const r of JSON.parse(text)) s.put({ table: "todos", pk: r.id, bucket: "user:x", base: r }, ["todos", r.id]); await done(tx); }
      const q = now();
      for (let k = 0; k < 200; k++) { const id = row(Math.floor(Math.random() * 10000)).id; await new Promise((res) => { const r = db.transaction("rows").objectStore("rows").get(["todos", id]); r.onsuccess = () => res(r.result); }); }
      results.objects_point_read_ms = (now() - q) / 200;
      db.close();
    }
    // The fetch limit's own work on the same texts: JSON.parse of each page.
    { const t = now(); let k = 0; for (const text of texts) k += JSON.parse(text).length; results.parse_only_ms = now() - t; }
    return results;
  },
};
document.getElementById("state").textContent = "ready";
