// An app as a developer writes it against the published package: `import ... from "kizunasync"`,
// a typed table map, no casts. Served by kizuna-server (`--www dist --dev-tokens`), it signs in as
// `?sub=<uuid>` and, in `?mode=write` (the default), puts the todo `?id=`, syncs and queries; in
// `?mode=read` (a second device) it pulls and reads that todo back. The outcome is written to
// `document.body.dataset` for tests/app/app.test.mjs.
import init, { KizunaClient, type SyncReport } from "kizunasync";

// The example table of server/sql/examples/todos.sql. The server fills in owner and updated_at,
// so they are optional: a row holds what this device wrote until a pull brings the server's row.
interface Todo {
  id: string;
  title: string;
  done: boolean;
  note?: string | null;
  position?: number | null;
  owner?: string;
  updated_at?: string;
}
interface Tables {
  todos: Todo;
}

const params = new URLSearchParams(location.search);
const sub = params.get("sub") ?? crypto.randomUUID();
const id = params.get("id") ?? crypto.randomUUID();
const mode = params.get("mode") ?? "write";
const app = document.querySelector<HTMLDivElement>("#app");

function show(key: string, value: string): void {
  document.body.dataset[key] = value;
}

function render(rows: Todo[]): void {
  if (!app) return;
  const list = document.createElement("ul");
  for (const todo of rows) {
    const item = document.createElement("li");
    item.textContent = `${todo.done ? "[x]" : "[ ]"} ${todo.title}`;
    list.append(item);
  }
  app.replaceChildren(list);
}

// The gateway's development tokens (kizuna-server --dev-tokens); a real app returns its auth
// library's access token here.
let cached: { token: string; expiresAt: number } | null = null;
async function token(): Promise<string | null> {
  if (cached && cached.expiresAt > Date.now() + 60_000) return cached.token;
  const res = await fetch("/kizuna/v1/dev-token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ sub }),
  });
  if (!res.ok) return null;
  const body: { token: string; expires_in: number } = await res.json();
  cached = { token: body.token, expiresAt: Date.now() + body.expires_in * 1000 };
  return body.token;
}

function describe(e: unknown): string {
  if (e instanceof Error) return `${e.name}${"code" in e ? ` ${String(e.code)}` : ""}: ${e.message}`;
  return String(e);
}

async function main(): Promise<void> {
  await init();
  const client = await KizunaClient.open<Tables>({
    name: `kizuna-vite-app-${sub}`,
    url: location.origin,
    token,
    buckets: [`user:${sub}`],
  });
  let applied = 0;
  client.on("applied", (e) => {
    if (e.table === "todos" && e.pk === id) applied += 1;
  });
  // watch() is newer than some builds of the package: use it where the build has it.
  let watchSaw: () => void = () => {};
  const watchSees = new Promise<void>((resolve) => (watchSaw = resolve));
  const watching = "watch" in client && typeof client.watch === "function";
  show("watch", watching ? "yes" : "no");
  if (watching) {
    client.watch("todos", { where: { done: false } }, (rows) => {
      const mine = rows.filter((t) => t.id === id).length;
      show("watched", String(mine));
      if (mine > 0) watchSaw();
      render(rows);
    });
  }

  if (mode === "read") {
    const report: SyncReport = await client.sync();
    const todo = await client.get("todos", id);
    show("owner", todo?.owner ?? "");
    show("result", todo ? `pulled:${todo.title}:${todo.done}` : `missing after sync (pulled: ${report.pulled})`);
  } else {
    const title = `from the vite app ${id}`;
    await client.put("todos", id, { id, title, done: false });
    const local = await client.query("todos", { where: { done: false } });
    show("local", String(local.filter((t) => t.id === id).length));
    const report = await client.sync();
    if (report.pushError) throw new Error(`push failed: ${report.pushError.code} ${report.pushError.message}`);
    const rows = await client.query("todos", { where: { done: false } });
    const mine = rows.filter((t) => t.id === id);
    render(rows);
    show("owner", mine[0]?.owner ?? "");
    show("pending", String(client.status().pending));
    show("applied", String(applied));
    // The watcher is told after each committed change; give it a moment to catch up.
    if (watching) await Promise.race([watchSees, new Promise((resolve) => setTimeout(resolve, 5000))]);
    show("result", `synced:${mine.length}`);
  }
  const health = client.getSyncHealth();
  show("leader", String(health.leader));
  show("failureStreak", String(health.failureStreak));
  client.close();
}

main().catch((e: unknown) => show("result", `error:${describe(e)}`));
