// What the demo tests share: one Chromium, a page opened as a visitor opens it (console errors
// recorded), the two devices' parts of the page, running a scenario by its buttons, screenshots.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

export const url = process.env.KIZUNA_DEMO_URL;
const db = process.env.KIZUNA_DEMO_DB;
const shots = "target/demo-screenshots";
let browser;

export async function launch() {
  assert.ok(url && db, "KIZUNA_DEMO_URL and KIZUNA_DEMO_DB must be set (scripts/test.sh starts the demo gateway)");
  mkdirSync(shots, { recursive: true });
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
}
export const close = () => browser?.close();

/** The server's answer to one SQL query, as text. */
export const sql = (query) => execFileSync("psql", [db, "-qAtc", query], { encoding: "utf8" }).trim();

/** A tab of a fresh browser (its own IndexedDB and localStorage), or of `context`, with the page loaded. */
export async function visit({ context, width = 1400, height = 1000 } = {}) {
  context ??= await browser.newContext({ viewport: { width, height } });
  const page = await context.newPage();
  page.problems = [];
  page.on("pageerror", (e) => page.problems.push(`page error: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") page.problems.push({ text: m.text(), url: m.location().url }); });
  await page.goto(url);
  await page.waitForSelector("body[data-ready=yes]", { timeout: 30000 });
  for (const d of ["device-1", "device-2"]) await page.waitForSelector(`#${d} dd.checkpoint:has-text("horizon")`, { timeout: 30000 });
  return { context, page };
}

/**
 * No error or warning in the console. `expected` lets through the browser's own line for each
 * response the test made the server refuse on purpose ("Failed to load resource: ... 409").
 */
export function quiet(page, expected = () => false) {
  const left = page.problems.filter((p) => !expected(p));
  assert.deepEqual(left, [], "nothing in the console");
}

/** The devices' parts, by what a visitor reads. */
export const dev = (page, n) => {
  const root = page.locator(`#device-${n}`);
  return {
    root,
    card: (title) => root.locator(".card").filter({ has: page.locator(".title").getByText(title, { exact: true }) }),
    list: (id) => root.locator(`.list[data-list="${id}"]`),
    feed: root.locator(".feed li"),
    outbox: root.locator(".outbox"),
    switch: root.locator("input.online"),
    progress: root.locator(".progress"),
    fingerprint: (id) => root.locator(`.list[data-list="${id}"] .fingerprint`),
  };
};

/** Picks a scenario, checks its watch line, and clicks its step `n` (0-based); resolves with the
 * line the banner ends on. */
export async function step(page, scenario, n, timeout = 60000) {
  await page.click(`.picker [data-scenario="${scenario}"]`);
  const banner = page.locator(`.scenario[data-scenario="${scenario}"]`);
  await banner.locator(`.step[data-step="${n}"]:not([disabled])`).click();
  await banner.locator('.state[data-tone="done"], .state[data-tone="bad"]').waitFor({ timeout });
  const state = banner.locator(".state");
  assert.equal(await state.getAttribute("data-tone"), "done", await state.textContent());
  return state.textContent();
}

export const watchLine = (page) => page.locator(".scenario .watch").textContent();

/** Saves a screenshot of the whole page (or of the window only) under target/demo-screenshots/. */
export const shoot = (page, name, { fullPage = true } = {}) =>
  page.screenshot({ path: `${shots}/${name}.png`, animations: "disabled", fullPage });
