// How an app uses the package's TypeScript types without declaring its tables; `make test`
// compiles it with --strict (and skipLibCheck off) against the generated pkg/kizunasync.d.ts.
// Any mistyped call here is a compile error, and the expected errors prove the types refuse what
// the client would refuse at run time. tests/types/typed.ts does the same with a table map.
import init, {
  KizunaClient, isKizunaError, type KizunaEvents, type PendingWrite, type Row, type SyncHealth, type SyncReport,
} from "../../pkg/kizunasync.js";

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
  const open: Row[] = await client.query("todos", { where: { done: false } });
  const all = await client.query("todos");
  const one: Row | null = await client.get("todos", "t1");
  const report: SyncReport = await client.sync();

  const off = client.on("rejected", (e) => {
    const reason: KizunaEvents["rejected"]["reason"] = e.reason;
    const budget: number = e.mutation.permanentFailures;
    console.log(reason, budget, e.serverRow);
  });
  client.on("pullProgress", (e) => console.log(e.pages, e.entries, e.total === null ? "?" : `${(100 * e.entries) / e.total}%`));
  client.on("conflicts", (e) => e.conflicts.forEach((c) => console.log(c.column, c.loser, c.winnerSeq)));
  off();

  const stop: () => void = client.watch("todos", { where: { done: false } }, (rows: Row[]) => console.log(rows.length));
  client.watch("todos", undefined, (rows) => console.log(rows.map((r) => r.title)));
  stop();

  const pending: PendingWrite[] = client.pendingWrites();
  const dead = client.deadLetters().map((d) => d.entry.seq);
  const { horizon } = client.getCheckpoint();
  const health: SyncHealth = client.getSyncHealth();
  const leads: boolean = health.leader;
  console.log(open.length, all.length, one, report.pushError?.code, pending[0]?.lastError, dead, horizon, health.failureStreak, leads);

  // Rows of an undeclared table are `Row`: their columns are `unknown`, never `any`.
  if (one) {
    // @ts-expect-error a column of an undeclared table is unknown until the app checks it
    const title: string = one.title;
    console.log(title);
  }
  // @ts-expect-error an unknown event name
  client.on("changed", () => {});
  // @ts-expect-error rows are objects of columns
  await client.put("todos", "t4", "not a row");
  // @ts-expect-error a misspelt write option
  await client.put("todos", "t5", { title: "x" }, { applyAftr: 5 });
  // @ts-expect-error a misspelt filter key
  await client.query("todos", { wher: { done: false } });
  // @ts-expect-error a misspelt filter key in watch
  client.watch("todos", { wher: { done: false } }, () => {});
  // @ts-expect-error a misspelt delete option
  await client.delete("todos", "t5", { latestOnlyy: true });
  // @ts-expect-error a batch member of an unknown op
  await client.batch([{ op: "insert", table: "todos", pk: "t6", row: {} }]);
  client.on("applied", (e) => console.log(e.table, e.pk, e.seq));

  try {
    await client.requeueDeadLetter(12345);
  } catch (e) {
    // @ts-expect-error a caught value is unknown until narrowed
    console.log(e.code);
    if (isKizunaError(e) && e.code === "NOT_FOUND") console.log("no such dead letter", e.message);
  }
  client.close();

  // The client is Disposable where the lib has explicit resource management (esnext here).
  {
    using scoped = await KizunaClient.open({ name: "scoped", url: "http://127.0.0.1:8787", token: () => null, buckets: [] });
    console.log(scoped.status().pending);
  }
}
