// One database open in several tabs, as a user has them: pages of one browser context in headless
// Chromium, each loading the npm package (pkg/) from the real gateway, against real PostgreSQL.
// What each test asserts is what a user would notice: every tab shows every change, writes land
// once, another tab takes over when the leading one closes or freezes, live queries follow.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const url = process.env.KIZUNA_TABS_URL;
const db = process.env.KIZUNA_TABS_DB;
const BULK_USER = "00000000-0000-4000-8000-000000000100";
// The promise: another tab takes over within 2 s of the leader closing, crashing or freezing.
const HANDOVER_LIMIT_MS = 2000;
let browser;

before(async () => {
  assert.ok(url && db, "KIZUNA_TABS_URL and KIZUNA_TABS_DB must be set (scripts/test.sh starts the gateway)");
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
});
after(() => browser?.close());

const sql = (query) => execFileSync("psql", [db, "-qAtc", query], { encoding: "utf8" }).trim();

async function until(what, check, timeout = 15000) {
  const start = Date.now();
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() - start > timeout) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** `count` pages of one context, each with a client on database `name` for `sub`. */
async function tabs(count, name, sub, options = {}) {
  const context = await browser.newContext();
  const pages = [];
  for (let i = 0; i < count; i++) {
    const page = await context.newPage();
    page.errors = [];
    page.on("pageerror", (e) => page.errors.push(e.message));
    await page.goto(`${url}/index.html`);
    await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
    await page.evaluate(([n, s, o]) => window.test.open(n, s, o), [name, sub, options]);
    pages.push(page);
  }
  return { context, pages };
}

const leads = (page) => page.evaluate(() => window.test.leads());

async function leader(pages) {
  return until("exactly one leading tab", async () => {
    const flags = await Promise.all(pages.map(leads));
    return flags.filter(Boolean).length === 1 ? pages[flags.indexOf(true)] : null;
  });
}

const pending = (page) => page.evaluate(() => window.test.client.pendingWrites().length);
const putItem = (page, id, list, title) =>
  page.evaluate(([id, list, title]) => window.test.client.put("hist_items", id, { id, list, title }), [id, list, title]);

/** Prints how long the handover since `started` took, and holds it to the promise. */
function handedOver(what, started) {
  const ms = Date.now() - started;
  console.log(`handover after ${what}: ${ms} ms`);
  assert.ok(ms < HANDOVER_LIMIT_MS, `took over in ${ms} ms after ${what}`);
}
const seen = (page, event) => page.evaluate((e) => window.test.seen[e], event);

test("three tabs write at once: one leads, every tab hears every change and verdict, each write applies once", async () => {
  const sub = randomUUID(), list = `tabs-${sub}`;
  const { context, pages } = await tabs(3, `tabs-${sub}`, sub, { buckets: [`hl:${list}`] });
  const first = await leader(pages);
  await Promise.all(pages.map((page, t) => page.evaluate(async ([t, list]) => {
    await Promise.all(Array.from({ length: 10 }, (_, i) =>
      window.test.client.put("hist_items", `t${t}-${i}`, { id: `t${t}-${i}`, list, title: `tab ${t} row ${i}` })));
  }, [t, list])));
  await until("the outbox drained", async () => (await Promise.all(pages.map(pending))).every((n) => n === 0));
  assert.equal(sql(`select count(*) || ' ' || min(n) || ' ' || max(n) from hist_items where list = '${list}'`), "30 1 1",
    "30 rows on the server, each written exactly once");
  const ids = Array.from({ length: 3 }, (_, t) => Array.from({ length: 10 }, (_, i) => `t${t}-${i}`)).flat().sort();
  for (const page of pages) {
    const changed = new Set((await seen(page, "change")).flatMap((c) => c.keys.map((k) => k.pk)));
    assert.deepEqual([...changed].filter((pk) => pk.startsWith("t")).sort(), ids, "every tab heard every tab's change");
    const applied = new Set((await seen(page, "applied")).map((a) => a.pk));
    assert.deepEqual([...applied].sort(), ids, "every tab heard every verdict");
    const rows = await page.evaluate((list) => window.test.client.query("hist_items", { where: { list } }), list);
    assert.equal(rows.length, 30, "every tab reads every row");
  }
  // A follower's sync() is run by the leader, and its checkpoint reaches every tab.
  const follower = pages.find((p) => p !== first);
  await follower.evaluate(() => window.test.client.sync());
  for (const page of pages) assert.ok((await seen(page, "checkpoint")).length > 0, "every tab heard the checkpoint");
  for (const page of pages) assert.deepEqual(page.errors, []);
  await context.close();
});

test("the leader closes, then a leading tab is closed: another takes over within 2 s each time and pushes the write made at that moment", async () => {
  const sub = randomUUID(), list = `close-${sub}`;
  const { context, pages } = await tabs(3, `close-${sub}`, sub, { buckets: [`hl:${list}`] });
  const old = await leader(pages);
  const rest = pages.filter((p) => p !== old);
  const started = Date.now();
  await Promise.all([
    old.evaluate(() => window.test.client.close()),
    putItem(rest[0], "at-handover", list, "written as the leader left"),
  ]);
  const next = await leader(rest);
  handedOver("the leader closed", started);
  await until("the write made at the handover on the server", () => sql(`select n from hist_items where id = 'at-handover'`) === "1");
  assert.ok(rest.includes(next));

  // The tab itself goes (closed, or its process gone) without a word from its JavaScript: the
  // browser frees its lock and the last tab leads.
  const last = rest.find((p) => p !== next);
  const gone = Date.now();
  await next.close();
  await until("the last tab leading", () => leads(last), 5000);
  handedOver("the leading tab was closed", gone);
  await putItem(last, "after-gone", list, "written by the last tab");
  await until("the last tab's write on the server", () => sql(`select n from hist_items where id = 'after-gone'`) === "1");
  await context.close();
});

test("the leading tab freezes: another takes over within 2 s; nothing is lost or applied twice", async () => {
  const sub = randomUUID(), list = `freeze-${sub}`;
  const { context, pages } = await tabs(2, `freeze-${sub}`, sub, { buckets: [`hl:${list}`] });
  const frozen = await leader(pages);
  const other = pages.find((p) => p !== frozen);
  await putItem(frozen, "before-freeze", list, "written by the leader");
  // Frozen between tasks, as the browser freezes a tab: not in the middle of an IndexedDB
  // transaction, which would hold every tab's writes until it resumed.
  await until("the leader's write pushed", () => sql(`select count(*) from hist_items where id = 'before-freeze'`) === "1");
  await until("the leader idle", async () => (await pending(frozen)) === 0 && !(await frozen.evaluate(() => window.test.client.getSyncHealth().inFlight)));
  await new Promise((r) => setTimeout(r, 500));
  // A frozen tab runs no task and keeps its locks and connections. CDP's lifecycle "frozen" state
  // leaves a visible headless page's timers running, so the leader's JavaScript is stopped with
  // the debugger instead: the same from every other tab's point of view.
  const cdp = await context.newCDPSession(frozen);
  await cdp.send("Debugger.enable");
  const started = Date.now();
  await cdp.send("Debugger.pause");
  await until("the other tab leading", () => leads(other), 10000);
  handedOver("the leader froze", started);
  await putItem(other, "after-freeze", list, "written while the leader was frozen");
  await until("both writes on the server", () => sql(`select count(*) from hist_items where list = '${list}'`) === "2");
  await cdp.send("Debugger.resume");
  await until("the thawed tab following", async () => !(await leads(frozen)) && (await leads(other)), 5000);
  await putItem(frozen, "after-thaw", list, "written after the thaw");
  await until("the thawed tab's write on the server", () => sql(`select count(*) from hist_items where list = '${list}'`) === "3");
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(sql(`select string_agg(id || '=' || n, ' ' order by id) from hist_items where list = '${list}'`),
    "after-freeze=1 after-thaw=1 before-freeze=1", "each write applied once");
  for (const page of pages) assert.equal(await pending(page), 0);
  await context.close();
});

test("watch follows local, other-tab, remote and compensation changes, and not unrelated ones", async () => {
  const sub = randomUUID();
  const { context, pages: [a, b] } = await tabs(2, `watch-${sub}`, sub);
  await leader([a, b]);
  await a.evaluate(() => {
    window.calls = [];
    window.stop = window.test.client.watch("todos", { where: { done: false } }, (rows) => window.calls.push(rows.map((r) => r.id).sort()));
  });
  const calls = () => a.evaluate(() => window.calls);
  const last = async () => (await calls()).at(-1);
  await until("the first call, with the current result", async () => (await calls()).length === 1);
  assert.deepEqual(await last(), []);
  const put = (page, id, row) => page.evaluate(([id, row]) => window.test.client.put("todos", id, { id, ...row }), [id, row]);

  await put(a, "local", { title: "from this tab", done: false });
  await until("the local write", async () => (await last()).includes("local"));
  await put(b, "other-tab", { title: "from another tab", done: false });
  await until("the other tab's write", async () => (await last()).includes("other-tab"));

  // The verdicts bring the server's columns (owner, updated_at): the result changes once more.
  await until("the outbox drained", async () => (await pending(a)) === 0);
  await until("the verdicts' rows shown", async () => (await last()).length === 2 && (await a.evaluate(() => window.test.client.query("todos"))).every((r) => r.owner));
  await new Promise((r) => setTimeout(r, 300));
  const before = (await calls()).length;
  await put(b, "done", { title: "done already", done: true });
  await b.evaluate(() => window.test.client.put("notes", "unrelated", { id: "unrelated", body: "another table" }).catch(() => {}));
  await new Promise((r) => setTimeout(r, 700));
  assert.equal((await calls()).length, before, "a change the filter excludes, or to another table, calls nothing");

  sql(`insert into todos (id, owner, title, done) values ('remote', '${sub}', 'written in SQL', false)`);
  await until("the remote row, after the wake stream's pull", async () => (await last()).includes("remote"));

  await put(a, "refused", { title: "far too long " + "x".repeat(220), done: false });
  await until("the refused row shown", async () => (await calls()).some((c) => c.includes("refused")));
  await until("the compensation taking it out", async () => !(await last()).includes("refused"));
  assert.deepEqual(await last(), ["local", "other-tab", "remote"]);

  await a.evaluate(() => window.stop());
  const stopped = (await calls()).length;
  await put(b, "later", { title: "after unsubscribing", done: false });
  await new Promise((r) => setTimeout(r, 500));
  assert.equal((await calls()).length, stopped, "an unsubscribed watch is not called");
  for (const page of [a, b]) assert.deepEqual(page.errors, []);
  await context.close();
});

test("a 100,000-row first sync: progress with a total that ends at 100% in every tab, and the store stays readable", async () => {
  const { context, pages } = await tabs(2, `bulk-${randomUUID()}`, BULK_USER, { pullLimit: 5000 });
  const follower = pages.find((p) => p !== pages[0]);
  // A read made in another tab while pages arrive finishes before the run does: no transaction
  // is held open across the network waits between pages.
  await follower.evaluate(() => {
    window.order = [];
    const off = window.test.client.on("pullProgress", () => {
      off();
      window.test.client.get("todos", "bulk-000001").then(() => window.order.push("read"));
    });
    window.test.client.on("checkpoint", () => window.order.push("run"));
  });
  await until("the first checkpoint", async () => (await seen(follower, "checkpoint")).length > 0, 240000);
  for (const page of pages) {
    const progress = await until("progress heard", async () => {
      const p = await seen(page, "pullProgress");
      return p.length > 0 && p.at(-1).entries === p.at(-1).total ? p : null;
    });
    for (const p of progress) {
      assert.ok(Number.isInteger(p.total) && p.total >= p.entries, `a total with every event: ${JSON.stringify(p)}`);
    }
    assert.equal(progress[0].total, 100000, "the first page says how many entries the run holds");
    assert.deepEqual({ entries: progress.at(-1).entries, total: progress.at(-1).total }, { entries: 100000, total: 100000 }, "ends at 100%");
  }
  assert.deepEqual(await follower.evaluate(() => window.order.slice(0, 2)), ["read", "run"], "the read finished while the run went on");
  assert.equal(await follower.evaluate(() => window.test.client.query("todos").then((r) => r.length)), 100000);
  await context.close();
});

test("no timer stays armed after close(), in the leading tab or a following one", async () => {
  const sub = randomUUID();
  const { context, pages } = await tabs(2, `timers-${sub}`, sub);
  await leader(pages);
  for (const page of pages) {
    await page.evaluate(async () => {
      await window.test.client.put("todos", "t", { id: "t", title: "x", done: false });
      window.test.client.watch("todos", undefined, () => {});
      await window.test.client.sync();
    });
  }
  for (const page of pages) {
    assert.ok(await page.evaluate(() => window.test.armedTimers()) > 0, "an open client keeps timers");
    await page.evaluate(() => window.test.client.close());
  }
  await new Promise((r) => setTimeout(r, 300));
  for (const page of pages) assert.deepEqual(await page.evaluate(() => window.test.armedTimerKinds()), [], "none after close()");
  await context.close();
});
