// The browser side of bench/ab/watch-change.sh: a live query of 10,000 rows, and the time from a
// patch of one of them to the listener, the median of fifteen, per round and package.
import { chromium } from "../../tools/node_modules/playwright-core/index.mjs";

const urls = process.env.KIZUNA_AB_URLS.split(",");
const rounds = Number(process.env.KIZUNA_AB_ROUNDS);
const ROWS = 20000, PATCHES = 15;
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
});
try {
  for (let r = 0; r < rounds; r++) {
    for (const [i, url] of urls.entries()) {
      const context = await browser.newContext();
      const page = await context.newPage();
      page.on("pageerror", (e) => console.error("page error:", e.message));
      await page.goto(`${url}/index.html`);
      await page.waitForFunction(() => document.getElementById("state").textContent === "ready");
      const { ms, shown } = await page.evaluate(async ([rows, patches]) => {
        const { KizunaClient } = await import("/pkg/kizunasync.js");
        const sub = crypto.randomUUID();
        const res = await fetch("/kizuna/v1/dev-token", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }) });
        const jwt = (await res.json()).token;
        const client = await KizunaClient.open({ name: `ab-${crypto.randomUUID()}`, url: location.origin, token: () => jwt, buckets: [`user:${sub}`], autoSync: false });
        for (let i = 0; i < rows; i += 1000) {
          await client.batch(Array.from({ length: 1000 }, (_, j) => ({ op: "upsert", table: "todos", pk: `r${i + j}`,
            row: { id: `r${i + j}`, title: `row ${i + j}`, done: (i + j) % 2 === 0, position: i + j } })));
        }
        let heard = null, wake = null;
        const stop = client.watch("todos", { where: { done: false } }, (result) => { heard = result; wake?.(); });
        while (heard === null) await new Promise((r) => setTimeout(r, 10));
        const times = [];
        for (let k = 0; k < patches; k++) {
          const told = new Promise((r) => { wake = r; });
          const started = performance.now();
          await client.patch("todos", `r${2 * k + 1}`, { title: `changed ${k}` });
          await told;
          times.push(performance.now() - started);
        }
        stop();
        client.close();
        times.sort((a, b) => a - b);
        return { ms: times[Math.floor(times.length / 2)], shown: heard.length };
      }, [ROWS, PATCHES]);
      await context.close();
      if (shown !== ROWS / 2) throw new Error(`the live query showed ${shown} rows, not ${ROWS / 2}`);
      console.log(`round ${r + 1} ${"AB"[i]}: ${ms.toFixed(1)} ms`);
    }
  }
} finally {
  await browser.close();
}
