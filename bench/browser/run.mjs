// `make bench`, browser part: drives bench/browser/ in headless Chromium against the real gateway
// (release build of the package) and writes target/bench/results.json and results.md, each
// figure beside the limit measured in the same run.
import { writeFileSync, readFileSync, mkdirSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const url = process.env.KIZUNA_BENCH_URL;
const BULK_USER = "00000000-0000-4000-8000-000000000100";
const MILLION_USER = "00000000-0000-4000-8000-000000000101";
if (!url) throw new Error("KIZUNA_BENCH_URL must be set (scripts/bench.sh starts the gateway)");
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
});
async function page(context) {
  const p = await context.newPage();
  p.on("pageerror", (e) => console.error("page error:", e.message));
  await p.goto(`${url}/index.html`);
  await p.waitForFunction(() => document.getElementById("state").textContent === "ready");
  return p;
}
const results = {};
const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
// The wake-up's parts, each a median over the writes B heard: the write until A's push begins
// (A's local write and step), A's push request, from its answer until B's pull begins (the wake
// stream), B's pull request, and from its answer until B's `change` event (B's commit).
function wakeParts(sent, heard, aRequests, bRequests) {
  const parts = { write: [], push: [], wake: [], pull: [], commit: [] };
  for (const [pk, at] of sent) {
    const h = heard.get(pk);
    const push = aRequests.find(([path, began]) => path === "kizuna_push" && began >= at);
    const pull = bRequests.filter(([path, began, answered]) => path === "kizuna_pull" && began >= at && answered <= h).pop();
    if (h === undefined || !push || !pull) continue;
    parts.write.push(push[1] - at);
    parts.push.push(push[2] - push[1]);
    parts.wake.push(pull[1] - push[2]);
    parts.pull.push(pull[2] - pull[1]);
    parts.commit.push(h - pull[2]);
  }
  return Object.fromEntries(Object.entries(parts).map(([k, xs]) => [`${k}_p50_ms`, median(xs) ?? null]));
}
// KIZUNA_BENCH_ONLY=local_write,batch runs only those parts (while working on one figure).
const only = process.env.KIZUNA_BENCH_ONLY?.split(",");
const runs = (part) => !only || only.includes(part);
try {
  const a = await page(await browser.newContext());
  if (runs("local_write")) results.local_write = await a.evaluate(() => window.bench.localWrite(300));
  if (runs("batch")) results.batch = await a.evaluate(() => window.bench.batch(1000));
  if (runs("initial_sync")) Object.assign(results, await a.evaluate(([s]) => window.bench.initialSync(s, 1000), [BULK_USER]));
  if (runs("open_pending")) Object.assign(results, await a.evaluate(() => window.bench.openPending(10000)));
  if (runs("sync_memory")) {
    // Each in a page of its own, so each memory figure is its sync's alone.
    for (const [key, user] of [["sync_100k", BULK_USER], ["sync_1m", MILLION_USER]]) {
      const p = await page(await browser.newContext());
      results[key] = await p.evaluate(([s]) => window.bench.syncMemory(s, 1000), [user]);
      await p.context().close();
    }
  }
  if (runs("push")) {
    // push: the browser's figures, and the SQL ones scripts/bench.sh measured (bench/push_slices.sql).
    results.push = await a.evaluate(() => window.bench.pushHttp(10000));
    try {
      const sql = JSON.parse(readFileSync("target/bench/push-sql.json", "utf8"));
      for (const [k, v] of Object.entries(sql)) results.push[k === "sql_ratio" || k === "sql_unsynced_ratio" ? k : `sql_${k}`] = v;
    } catch (e) {
      console.error("push.sql figures missing (run through scripts/bench.sh):", e.message);
    }
  }

  if (runs("wake_latency")) {
    const sub = crypto.randomUUID();
    const b = await page(await browser.newContext());
    await b.evaluate((s) => window.bench.listen(s), sub);
    const sent = await a.evaluate(([s]) => window.bench.speak(s, 20), [sub]);
    const heard = new Map(await b.evaluate(() => window.heard));
    const latencies = sent.filter(([pk]) => heard.has(pk)).map(([pk, at]) => heard.get(pk) - at);
    const sorted = latencies.sort((x, y) => x - y);
    results.wake_latency = { samples: sorted.length, of: sent.length, p50_ms: median(sorted), p99_ms: sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))],
                             ...wakeParts(sent, heard, await a.evaluate(() => window.requests), await b.evaluate(() => window.requests)) };
    // The same steps with nothing of the client's in them, in the same pages right after: what
    // this host allows a wake-up (see bench.js, wakeFloor), and the wake-up's ratio to it.
    Object.assign(results.wake_latency, await a.evaluate(([s]) => window.bench.wakeFloor(s, 20), [sub]));
    results.wake_latency.floor_ratio = results.wake_latency.p50_ms / results.wake_latency.floor_total_p50_ms;
  }

  const wasm = readFileSync("pkg/kizunasync_bg.wasm"), js = readFileSync("pkg/kizunasync.js");
  results.bundle = { wasm_bytes: wasm.length, wasm_gzip_bytes: gzipSync(wasm, { level: 9 }).length, js_gzip_bytes: gzipSync(js, { level: 9 }).length };
} finally {
  await browser.close();
}

const targets = {
  "local_write.ratio": ["≤", 1.2], "batch.ratio": ["≤", 1.2], "initial_sync.ratio": ["≤", 1.1], "initial_sync.fetch_ratio": ["≤", 1.5],
  "sync_1m.wasm_memory_bytes": ["≤", 16 * 1024 * 1024], "query.ratio": ["≤", 1.0], "query_few.ms": ["≤", 10], "open_pending.ms": ["≤", 500],
  "push.sql_ratio": ["≤", 3], "push.http_ratio": ["≤", 1.3], "wake_latency.p50_ms": ["≤", 30], "bundle.wasm_gzip_bytes": ["≤", 120000],
};
const get = (key) => key.split(".").reduce((o, k) => o?.[k], results);
const fmt = (v) => typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(2)) : String(v);
mkdirSync("target/bench", { recursive: true });
writeFileSync("target/bench/results.json", JSON.stringify(results, null, 2) + "\n");
const lines = ["# make bench: the browser client beside its limits", "", `measured ${new Date().toISOString()}, headless Chromium, release build`, "",
  "| figure | value | target | met |", "|---|---|---|---|"];
for (const [key, [op, limit]] of Object.entries(targets)) {
  const v = get(key);
  lines.push(`| \`${key}\` | ${fmt(v)} | ${op} ${limit} | ${typeof v === "number" && v <= limit ? "yes" : "no"} |`);
}
lines.push("", "| detail | value |", "|---|---|");
for (const [group, figures] of Object.entries(results)) for (const [k, v] of Object.entries(figures)) lines.push(`| \`${group}.${k}\` | ${fmt(v)} |`);
writeFileSync("target/bench/results.md", lines.join("\n") + "\n");
console.log(lines.join("\n"));
