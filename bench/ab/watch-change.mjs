// The browser side of bench/ab/watch-change.sh: a live query of 10,000 rows, and the time from a
// patch of one of them to the listener, the median of fifteen, per round and package.
import { alternate } from "./rounds.mjs";

const ROWS = 20000, PATCHES = 15;
await alternate(async (page, side) => {
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
  if (shown !== ROWS / 2) throw new Error(`package ${side}'s live query showed ${shown} rows, not ${ROWS / 2}`);
  return ms;
});
