// Shared by the A/B scripts' browser sides: headless Chromium, and for each round and package (the
// gateways of KIZUNA_AB_URLS, KIZUNA_AB_ROUNDS rounds) a fresh browser context on the bench page,
// handed to `measure(page)`, which returns its figure in ms (and throws on a wrong result). Prints
// each figure as it comes, then each package's median and in how many rounds B was quicker.
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

export async function alternate(measure) {
  const urls = process.env.KIZUNA_AB_URLS.split(",");
  const rounds = Number(process.env.KIZUNA_AB_ROUNDS);
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
  const times = urls.map(() => []);
  try {
    for (let r = 0; r < rounds; r++) {
      for (const [i, url] of urls.entries()) {
        const context = await browser.newContext();
        const page = await context.newPage();
        page.on("pageerror", (e) => console.error("page error:", e.message));
        await page.goto(`${url}/index.html`);
        await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
        const ms = await measure(page, "AB"[i]);
        times[i].push(ms);
        console.log(`round ${r + 1} ${"AB"[i]}: ${ms.toFixed(1)} ms`);
        await context.close();
      }
    }
  } finally {
    await browser.close();
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const show = (xs) => xs.map((t) => t.toFixed(1)).join(" / ");
  const bWon = times[1].filter((t, r) => t < times[0][r]).length;
  console.log(`A: ${show(times[0])} ms, median ${median(times[0]).toFixed(1)}`);
  console.log(`B: ${show(times[1])} ms, median ${median(times[1]).toFixed(1)}; B quicker in ${bWon} of ${rounds} rounds`);
}
