// The history checker's hands in a browser: one headless Chromium (Debian's, through
// playwright-core), a browser context and page per client, each page running the real npm package
// (pkg/) from a loopback origin served here. The checker (src/browser.rs) sends one JSON command per
// line on stdin and reads one JSON answer per line on stdout; every answer carries the events the
// pages reported since the last answer, each with its page (`gen`, counted per client) and its number
// in the order that page heard them.
//
//   node driver.mjs PKG_DIR
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { createInterface } from "node:readline";
import { join, extname, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "../../../tools/node_modules/playwright-core/index.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = process.argv[2];
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm", ".json": "application/json" };

// The pages' origin: the harness and the package, nothing else.
const server = createServer(async (req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  const file = path.startsWith("/pkg/") ? join(pkg, path.slice(5)) : join(here, path === "/" ? "harness.html" : path.slice(1));
  try {
    const body = await readFile(file);
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    res.end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const origin = `http://127.0.0.1:${server.address().port}`;

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
});

/** client name -> { context, page, params, events, unsent, base, errors } */
const clients = new Map();

/** Takes an event a page heard, once: a page's report and what the next page finds kept may both carry it. */
function report(c, event) {
  const key = `${event.gen}:${event.n}`;
  if (c.received.has(key)) return;
  c.received.add(key);
  c.unsent.push(event);
}

async function openPage(c) {
  c.params.gen = (c.params.gen ?? 0) + 1; // the new page numbers its events from 0
  // An offline browser loads no page, not even from loopback; an installed app would load from its
  // cache. So the page loads online, and the client opens offline.
  if (c.offline) await c.context.setOffline(false);
  await c.page.goto(`${origin}/`);
  await c.page.waitForFunction(() => window.harness?.ready === true);
  // What the page before heard and kept (harness.js), in case its report was lost as it went away.
  const kept = await c.page.evaluate(() => {
    const heard = Object.keys(sessionStorage).filter((k) => k.startsWith("heard:")).map((k) => JSON.parse(sessionStorage.getItem(k)));
    sessionStorage.clear();
    return heard;
  });
  for (const event of kept) report(c, event);
  if (c.offline) await c.context.setOffline(true);
  await c.page.evaluate((p) => window.harness.open(p), c.params);
}

const commands = {
  async open({ client, params }) {
    const context = await browser.newContext();
    const page = await context.newPage();
    const c = { context, page, params, unsent: [], received: new Set(), errors: [], console: [], offline: false };
    page.on("pageerror", (e) => c.errors.push(e.message));
    page.on("console", (m) => { if (m.type() === "error") c.console.push(m.text()); });
    await page.exposeBinding("kizunaReport", (_source, gen, n, name, payload, early) => report(c, { gen, n, name, payload, early }));
    clients.set(client, c);
    await openPage(c);
    return {};
  },
  write: ({ c, writes }) => c.page.evaluate((w) => window.harness.write(w), writes),
  sync: ({ c }) => c.page.evaluate(() => window.harness.sync()),
  progress: ({ c }) => c.page.evaluate(() => window.harness.progress()),
  read: ({ c, written }) => c.page.evaluate((w) => window.harness.read({ written: w }), written),
  // An app that reloads: it closes its client first (what an app's unload handler does).
  async reload({ c, buckets }) {
    if (buckets) c.params.buckets = buckets;
    await c.page.evaluate(() => window.harness.close());
    await openPage(c);
    return {};
  },
  // A tab that goes away with a push on the wire: no close, no unload work.
  async pushThenReload({ c }) {
    await c.page.evaluate(() => { window.harness.client.sync().catch(() => {}); });
    await new Promise((r) => setTimeout(r, 5 + Math.floor(Math.random() * 20)));
    await openPage(c);
    return {};
  },
  async offline({ c, on }) {
    c.offline = on;
    await c.context.setOffline(on);
    return {};
  },
  async close({ c }) {
    await c.context.close();
    return {};
  },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const { id, cmd, client, ...args } = JSON.parse(line);
  const c = clients.get(client);
  let answer;
  try {
    if (cmd === "quit") break;
    if (!commands[cmd]) throw new Error(`unknown command ${cmd}`);
    if (cmd !== "open" && !c) throw new Error(`no client ${client}`);
    answer = { id, ok: await commands[cmd]({ client, c, ...args }) };
  } catch (e) {
    answer = { id, error: String(e?.message ?? e) };
  }
  const now = clients.get(client);
  if (now) {
    answer.events = now.unsent;
    now.unsent = [];
    answer.pageErrors = now.errors.splice(0);
    answer.console = now.console.splice(0);
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
await browser.close();
server.close();
