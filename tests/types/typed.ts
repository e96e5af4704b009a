// An app that declares its tables: reads and writes are typed by table name with no casts, and
// typos fail to compile. `make test` compiles it with --strict and skipLibCheck off against the
// generated pkg/kizunasync.d.ts; every @ts-expect-error line must be an error, or tsc fails.
import init, {
  KizunaClient, isKizunaError,
  type BatchWrite, type ErrorCode, type FromSupabase, type KizunaError, type RowOf, type TableName,
} from "../../pkg/kizunasync.js";

// The app's tables, declared as interfaces (which have no implicit index signature). Columns the
// server fills in (defaults) are optional: a row written here holds what the app wrote until a
// pull brings the server's row.
interface Todo { id: string; owner?: string; title: string; done: boolean; note: string | null; position?: number | null; updated_at?: string }
interface Note { id: string; body: string; pinned: boolean }
interface Tables { todos: Todo; notes: Note }

// Compile-time equality: `expect<Equal<A, B>>(true)` fails unless A and B are the same type.
type Equal<A, B> = (<G>() => G extends A ? 1 : 2) extends (<G>() => G extends B ? 1 : 2) ? true : false;
function expect<T extends true>(ok: T): T { return ok; }

export async function typed(): Promise<void> {
  await init();
  const client = await KizunaClient.open<Tables>({ name: "typed", url: "http://127.0.0.1:8787", token: () => "jwt", buckets: ["user:1"],
    indexes: { todos: ["done", "owner"], notes: ["pinned"] } });
  // @ts-expect-error: a column the table does not have cannot be indexed
  await KizunaClient.open<Tables>({ name: "typed", url: "u", token: () => null, buckets: [], indexes: { todos: ["dne"] } });
  // @ts-expect-error: nor can a table the app does not have
  await KizunaClient.open<Tables>({ name: "typed", url: "u", token: () => null, buckets: [], indexes: { todoz: ["done"] } });

  await client.put("todos", "t1", { id: "t1", title: "buy milk", done: false, note: null });
  await client.put("todos", "t1", { done: true }, { applyAfter: Date.now() + 1000, latestOnly: true });
  await client.patch("notes", "n1", { pinned: true });
  await client.delete("notes", "n1");
  const writes: BatchWrite<Tables>[] = [
    { op: "upsert", table: "todos", pk: "t2", row: { id: "t2", title: "x", done: false } },
    { op: "patch", table: "notes", pk: "n2", columns: { body: "y" } },
    { op: "delete", table: "todos", pk: "t1" },
  ];
  await client.batch(writes);

  const todo = await client.get("todos", "t1");
  expect<Equal<typeof todo, Todo | null>>(true);
  const titles: string[] = (await client.list("todos")).map((t) => t.title);
  const open = await client.query("todos", { where: { done: false } });
  expect<Equal<typeof open, Todo[]>>(true);
  const pinned: Note[] = await client.query("notes", { where: { pinned: true }, bucket: "user:1" });
  const stop = client.watch("todos", { where: { done: false } }, (rows) => {
    expect<Equal<typeof rows, Todo[]>>(true);
    console.log(rows.map((r) => `${r.title}${r.done ? " (done)" : ""}`));
  });
  stop();
  client.watch("notes", undefined, (rows) => console.log(rows.filter((n) => n.pinned).length));
  const firstOpen: Todo[] = await client.query("todos", { where: { done: false }, orderBy: ["position", "desc"], limit: 10 });
  client.watch("todos", { orderBy: "title", limit: 3 }, (rows) => console.log(rows.length, firstOpen.length));
  if (todo) console.log(todo.title.toUpperCase(), todo.done, todo.note?.length);
  console.log(titles, pinned);

  expect<Equal<TableName<Tables>, "todos" | "notes">>(true);
  expect<Equal<RowOf<Tables, "notes">, Note>>(true);

  // @ts-expect-error an unknown table name
  await client.put("todo", "t3", { title: "x" });
  // @ts-expect-error an unknown table name in a read
  await client.query("users");
  // @ts-expect-error a column of the wrong type
  await client.put("todos", "t3", { done: "yes" });
  // @ts-expect-error a column the table does not have
  await client.patch("todos", "t3", { titel: "x" });
  // @ts-expect-error a misspelt write option
  await client.put("todos", "t3", { title: "x" }, { applyAftr: 5 });
  // @ts-expect-error a misspelt filter key
  await client.query("todos", { wher: { done: false } });
  // @ts-expect-error a filter value of the wrong type
  await client.query("todos", { where: { done: "no" } });
  // @ts-expect-error an order by a column the table does not have
  await client.query("todos", { orderBy: "titel" });
  // @ts-expect-error a direction other than "asc" or "desc"
  await client.query("todos", { orderBy: ["position", "down"] });
  // @ts-expect-error a limit that is not a number
  client.watch("todos", { limit: "3" }, () => {});
  // @ts-expect-error watch filters are typed the same way
  client.watch("todos", { where: { position: "first" } }, () => {});
  // @ts-expect-error the listener gets rows of the watched table
  client.watch("notes", undefined, (rows: Todo[]) => console.log(rows));
  // @ts-expect-error a batch member's columns belong to its own table
  await client.batch([{ op: "upsert", table: "notes", pk: "n3", row: { done: true } }]);
  // @ts-expect-error a batch member of an unknown table
  await client.batch([{ op: "delete", table: "todoz", pk: "n3" }]);
  if (todo) {
    // @ts-expect-error a read row has only the declared columns
    console.log(todo.titel);
  }

  try {
    await client.put("todos", "", { title: "no key" });
  } catch (e) {
    // @ts-expect-error a caught value is unknown until narrowed
    console.log(e.code);
    if (isKizunaError(e)) {
      const err: KizunaError = e;
      const code: ErrorCode = err.code;
      if (e.code === "INVALID_ARGUMENT") console.log("bad argument:", e.message, e.retryable);
      switch (code) {
        case "KZA01": case "AUTH_SESSION_MISSING": console.log("sign in again"); break;
        case "OFFLINE": case "NETWORK": case "TIMEOUT": console.log("later"); break;
        default: console.log(code, e.name === "KizunaError");
      }
    }
  }
  client.on("pushFailed", (e) => { const code: ErrorCode = e.code; console.log(code, e.retryable); });
  client.close();
}

// A supabase-js generated Database type (the shape `supabase gen types typescript` writes).
type Json = string | number | boolean | null | { [key: string]: Json | undefined } | Json[];
type Database = {
  __InternalSupabase: { PostgrestVersion: "13.0.5" };
  public: {
    Tables: {
      todos: {
        Row: { id: string; owner: string; title: string; done: boolean; note: string | null; position: number | null; updated_at: string };
        Insert: { id: string; owner?: string; title?: string; done?: boolean; note?: string | null; position?: number | null; updated_at?: string };
        Update: { id?: string; owner?: string; title?: string; done?: boolean; note?: string | null; position?: number | null; updated_at?: string };
        Relationships: [];
      };
      cards: {
        Row: { id: string; owner: string; meta: Json };
        Insert: { id: string; owner?: string; meta?: Json };
        Update: { id?: string; owner?: string; meta?: Json };
        Relationships: [];
      };
    };
    Views: { [_ in never]: never };
    Functions: { kizuna_pull: { Args: { request: Json }; Returns: Json } };
    Enums: { [_ in never]: never };
    CompositeTypes: { [_ in never]: never };
  };
  audit: {
    Tables: { events: { Row: { id: number; what: string }; Insert: { what: string }; Update: { what?: string }; Relationships: [] } };
    Views: { [_ in never]: never };
  };
};

export async function supabaseTyped(): Promise<void> {
  const client = await KizunaClient.open<FromSupabase<Database>>({ name: "sb", url: "https://x.supabase.co", token: () => null, buckets: [], apikey: "anon" });
  expect<Equal<TableName<FromSupabase<Database>>, "todos" | "cards">>(true);
  expect<Equal<RowOf<FromSupabase<Database>, "todos">, Database["public"]["Tables"]["todos"]["Row"]>>(true);
  expect<Equal<RowOf<FromSupabase<Database, "audit">, "events">, { id: number; what: string }>>(true);
  await client.put("cards", "c1", { meta: { tags: ["a"], n: 1 } });
  const done: Database["public"]["Tables"]["todos"]["Row"][] = await client.query("todos", { where: { done: true } });
  console.log(done.map((t) => t.updated_at));
  // @ts-expect-error a table of another schema
  await client.get("events", "1");
  // @ts-expect-error a column of the wrong type
  await client.patch("todos", "t1", { position: "top" });
}
