// Runs bench/layout/ in headless Chromium ROUNDS times, each in a fresh context, and prints each
// round's figures: node bench/layout/run.mjs URL [ROUNDS] (bench/layout/layout.sh serves it).
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";
const [url, rounds = "2"] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"] });
try {
  for (let round = 0; round < Number(rounds); round++) {
    const page = await (await browser.newContext()).newPage();
    await page.goto(url);
    await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
    const figures = await page.evaluate(() => window.exp.run());
    console.log(JSON.stringify(Object.fromEntries(Object.entries(figures).map(([k, v]) => [k, Math.round(v * 100) / 100]))));
    await page.context().close();
  }
} finally {
  await browser.close();
}
