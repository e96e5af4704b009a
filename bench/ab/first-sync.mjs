// The browser side of bench/ab/first-sync.sh: one first sync per round and package, in a fresh
// browser context each, timed around `pull()`; checks that every row arrived.
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const urls = process.env.KIZUNA_AB_URLS.split(",");
const rounds = Number(process.env.KIZUNA_AB_ROUNDS);
const BULK_USER = "00000000-0000-4000-8000-000000000100";
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
      const { ms, rows } = await page.evaluate(async (sub) => {
        const { KizunaClient } = await import("/pkg/kizunasync.js");
        const res = await fetch("/kizuna/v1/dev-token", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }) });
        const jwt = (await res.json()).token;
        const client = await KizunaClient.open({ name: `ab-${crypto.randomUUID()}`, url: location.origin, token: () => jwt, buckets: [`user:${sub}`], autoSync: false, pullLimit: 1000 });
        const started = performance.now();
        await client.pull();
        const ms = performance.now() - started;
        const rows = (await client.list("todos")).length;
        client.close();
        return { ms, rows };
      }, BULK_USER);
      if (rows !== 100000) throw new Error(`package ${"AB"[i]} synced ${rows} rows of 100000`);
      times[i].push(Math.round(ms));
      console.log(`round ${r + 1} ${"AB"[i]}: ${Math.round(ms)} ms`);
      await context.close();
    }
  }
} finally {
  await browser.close();
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const bWon = times[1].filter((t, r) => t < times[0][r]).length;
console.log(`A: ${times[0].join(" / ")} ms, median ${median(times[0])}`);
console.log(`B: ${times[1].join(" / ")} ms, median ${median(times[1])}; B faster in ${bWon} of ${rounds} rounds`);
