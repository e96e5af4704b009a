// The browser side of bench/ab/first-sync.sh: one first sync per round and package, in a fresh
// browser context each, timed around `pull()`; checks that every row arrived.
import { alternate } from "./rounds.mjs";

const BULK_USER = "00000000-0000-4000-8000-000000000100";
await alternate(async (page, side) => {
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
  if (rows !== 100000) throw new Error(`package ${side} synced ${rows} rows of 100000`);
  return ms;
});
