// How an app uses the package's TypeScript types; `make test` compiles it with --strict against
// the generated pkg/kizunasync.d.ts. Any mistyped call here is a compile error, and the two
// expected errors at the end prove the types refuse what the client would refuse at run time.
import init, { KizunaClient, type KizunaEvents, type PendingWrite, type SyncReport } from "../../pkg/kizunasync.js";

export async function usage(): Promise<void> {
  await init();
  const client = await KizunaClient.open({
    name: "app-user1", url: "http://127.0.0.1:8787", token: async () => "jwt", buckets: ["user:1"], pullLimit: 500,
  });
  await client.put("todos", "t1", { title: "buy milk", done: false });
  await client.put("todos", "t2", { title: "later" }, { applyAfter: new Date(Date.now() + 60_000) });
  await client.patch("todos", "t1", { done: true });
  await client.delete("todos", "t2");
  await client.batch([{ op: "upsert", table: "todos", pk: "t3", row: { title: "x" } }, { op: "delete", table: "todos", pk: "t1" }]);
  const open = await client.query("todos", { where: { done: false } });
  const all = await client.query("todos");
  const one = await client.get("todos", "t1");
  const report: SyncReport = await client.sync();

  const off = client.on("rejected", (e) => {
    const reason: KizunaEvents["rejected"]["reason"] = e.reason;
    const budget: number = e.mutation.permanentFailures;
    console.log(reason, budget, e.serverRow);
  });
  client.on("pullProgress", (e) => console.log(e.pages, e.entries));
  client.on("conflicts", (e) => e.conflicts.forEach((c) => console.log(c.column, c.loser, c.winnerSeq)));
  off();

  const pending: PendingWrite[] = client.pendingWrites();
  const dead = client.deadLetters().map((d) => d.entry.seq);
  const { horizon } = client.getCheckpoint();
  const { failureStreak } = client.getSyncHealth();
  console.log(open.length, all.length, one, report.pushError?.code, pending[0]?.lastError, dead, horizon, failureStreak);

  // @ts-expect-error an unknown event name
  client.on("changed", () => {});
  // @ts-expect-error rows are objects of columns
  await client.put("todos", "t4", "not a row");
  // @ts-expect-error a misspelt write option
  await client.put("todos", "t5", { title: "x" }, { applyAftr: 5 });
  // @ts-expect-error a misspelt filter key
  await client.query("todos", { wher: { done: false } });
  // @ts-expect-error a misspelt delete option
  await client.delete("todos", "t5", { latestOnlyy: true });
  client.on("applied", (e) => console.log(e.table, e.pk, e.seq));
  client.close();
}
