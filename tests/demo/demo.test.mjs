// The demo page as a person uses it, in headless Chromium: the npm package (pkg/) loaded by a
// page from the real gateway. Two browser contexts stand for two devices.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const url = process.env.KIZUNA_DEMO_URL;
let browser;

before(async () => {
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
});
after(() => browser?.close());

async function device(user = "Alice") {
  const page = await (await browser.newContext()).newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(url);
  await page.waitForSelector("#status dd");
  if (user !== "Alice") {
    await page.selectOption("#user", { label: user });
    await page.waitForTimeout(300);
    await page.waitForSelector("#status dd");
  }
  return { page, errors };
}

const titles = (page) => page.locator("#todos .title").allTextContents();

// The page writes and re-renders after the click has returned: wait for the list to show `title`.
const shows = (page, title, timeout = 15000) =>
  page.waitForFunction((t) => [...document.querySelectorAll("#todos .title")].some((e) => e.textContent === t), title, { timeout });

test("a todo added on one device appears on the other, and never for another user", async () => {
  const a = await device(), b = await device(), bob = await device("Bob");
  const title = `milk ${Date.now()}`;
  await a.page.fill("#title", title);
  await a.page.click("#add button");
  await shows(a.page, title, 5000);
  await shows(b.page, title);
  await bob.page.click("#sync");
  await bob.page.waitForTimeout(500);
  assert.ok(!(await titles(bob.page)).includes(title), "another user's list never shows it");
  for (const d of [a, b, bob]) assert.deepEqual(d.errors, []);
});

test("a title the server refuses comes back out and the refusal is shown", async () => {
  const a = await device();
  const title = "far too long " + "x".repeat(220);
  await a.page.fill("#title", title);
  await a.page.click("#add button");
  await a.page.waitForSelector("#log li.rejected", { timeout: 15000 });
  assert.match(await a.page.locator("#log li.rejected").first().textContent(), /VALIDATION_FAILED/);
  await a.page.waitForFunction((t) => ![...document.querySelectorAll("#todos .title")].some((e) => e.textContent === t), title);
  assert.deepEqual(a.errors, []);
});

test("writes made offline wait in the outbox and go out when the network is back", async () => {
  const a = await device();
  await a.page.check("#offline");
  const title = `offline ${Date.now()}`;
  await a.page.fill("#title", title);
  await a.page.click("#add button");
  await a.page.waitForTimeout(1500);
  const row = a.page.locator("#todos li", { hasText: title });
  assert.equal(await row.locator(".pending").textContent(), "pending");
  await a.page.uncheck("#offline");
  await a.page.click("#sync");
  await row.locator(".pending:text-is('')").waitFor({ state: "attached", timeout: 15000 });
  const other = await device();
  await shows(other.page, title);
  assert.deepEqual(a.errors, []);
});
