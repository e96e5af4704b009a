//! The package's TypeScript declarations, written by hand: the client class is generic over the
//! app's tables, which wasm-bindgen cannot express, so its generated declaration is skipped. The
//! shipped `.d.ts` holds no `any` (scripts/package.sh checks it, and turns the `any` of
//! wasm-bindgen's raw wasm exports into `unknown`), so these comments avoid the word as well.

use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** A row: column name to JSON value. */
export type Row = Record<string, unknown>;

/**
 * The table map of an app that declares none: every table name is allowed and rows are `Row`.
 * An app declares its own map (an `interface` or a type) and passes it as `KizunaClient.open<Tables>(...)`.
 */
export type AnyTables = Record<string, Row>;

/** The table names of a table map. */
export type TableName<DB extends object> = Extract<keyof DB, string>;

/** The row type of table `T` in a table map. */
export type RowOf<DB extends object, T extends TableName<DB>> = DB[T] extends object ? DB[T] : Row;

/**
 * A table map from a supabase-js generated `Database` type (`supabase gen types typescript`):
 * each table of the schema (default "public") mapped to its `Row` type.
 *
 * ```ts
 * const client = await KizunaClient.open<FromSupabase<Database>>({ ... });
 * ```
 */
export type FromSupabase<D, Schema extends string = "public"> =
  D extends { [S in Schema]: { Tables: infer Tables } }
    ? { [T in Extract<keyof Tables, string>]: Tables[T] extends { Row: infer R extends object } ? R : Row }
    : never;

/**
 * Every error code the client and its server are known to produce. Codes of the server's
 * database (PostgreSQL SQLSTATEs such as "42501" or "22P05") come through as they are, so the
 * union stays open.
 */
export type ErrorCode =
  /** A bad argument or option; the message names it. Nothing was stored. */
  | "INVALID_ARGUMENT"
  /** requeueDeadLetter/discardDeadLetter of a seq that is not a dead letter. */
  | "NOT_FOUND"
  /** A call after close() or free(). */
  | "CLIENT_CLOSED"
  /** IndexedDB refused or failed. */
  | "STORAGE_FAILED"
  /** IndexedDB is not available in this context. */
  | "STORAGE_UNAVAILABLE"
  /** IndexedDB holds a record this version cannot read. */
  | "STORAGE_CORRUPT"
  /** open() while another tab holds the database at an earlier schema and does not let go (a tab
   * of an earlier version of Kizuna): close or reload that tab. Retryable. */
  | "STORAGE_BLOCKED"
  /** A newer version of Kizuna (another tab) upgraded or deleted the database: this client let go
   * of it, and this version can no longer open it. Reload the page. */
  | "STORAGE_UPGRADED"
  /** sync() while the browser reports no network. Retryable. */
  | "OFFLINE"
  /** No answer, or a cut-off answer. Retryable. */
  | "NETWORK"
  /** No whole answer within `requestTimeoutMs`. Retryable. */
  | "TIMEOUT"
  /** The token provider returned no token or threw. Retryable. */
  | "AUTH_SESSION_MISSING"
  /** The token provider did not settle within 10 s. Retryable. */
  | "AUTH_SESSION_TIMEOUT"
  /** The server's push answer does not fit the request. Retryable. */
  | "BAD_RESPONSE"
  /** A pull page would have moved the checkpoint backwards; the run is retried. */
  | "PULL_ABANDONED"
  | "CURSOR_REGRESSION"
  /** Malformed request (the SQL pack or the gateway). Permanent. */
  | "KZP01"
  /** More mutations than the table's `max_batch_size`. The slice is halved. */
  | "KZP02"
  /** Unsupported protocol version. Permanent. */
  | "KZP03"
  /** A row over the pack's `max_row_bytes`. Permanent. */
  | "KZP04"
  /** The server refused the token (HTTP 401). Retryable: the session may refresh. */
  | "KZA01"
  /** Request body over the gateway's limit (HTTP 413). The slice is halved. */
  | "KZG01"
  /** A body that is not JSON, or not of the expected shape (HTTP 400). Permanent. */
  | "KZG02"
  /** The database or its pool is unavailable (HTTP 503). Retryable. */
  | "KZG03"
  /** No such endpoint or method (HTTP 404/405), usually a wrong `url`. Retryable. */
  | "KZG04"
  /** This caller has too many requests in flight (HTTP 429). Retryable. */
  | "KZG05"
  /** The request's body did not arrive in time (HTTP 408). Retryable. */
  | "KZG06"
  /** A sync() in a tab that lost the lead while it ran (it was frozen or stalled and another tab
   * took over). Retryable: call again, the new leader runs it. */
  | "NOT_LEADER"
  /** A refusal whose body is no Kizuna or PostgREST error (a proxy's HTML page, a `url` that is
   * not Kizuna): 4xx permanent except 401, 404, 405, 408, 425 and 429; the others retried. */
  | `HTTP${number}`
  | (string & {});

/** What the client throws, and what its promises reject with. */
export interface KizunaError extends Error {
  name: "KizunaError";
  code: ErrorCode;
  /** Present where the client decided it: whether trying again later can succeed. */
  retryable?: boolean;
}

/** True when `e` is an error thrown by the client (answers at once). */
export function isKizunaError(e: unknown): e is KizunaError;

export interface ClientOptions<DB extends object = AnyTables> {
  /** IndexedDB database name; one per user and app. Every tab may open the same name. */
  name: string;
  /** Base URL of the gateway or Supabase project, e.g. "http://127.0.0.1:8787". */
  url: string;
  /** Returns the current access token (JWT), a promise of one, or null when signed out. */
  token: () => string | null | Promise<string | null>;
  /** Buckets to pull, e.g. ["user:<uid>"]. */
  buckets: string[];
  /** Supabase anon key, sent as `apikey` when given. */
  apikey?: string;
  /** A fetch to use instead of globalThis.fetch (proxies, tests). */
  fetch?: typeof fetch;
  /** Run push and pull loops on timers (default true). When false, only sync() talks to the server. */
  autoSync?: boolean;
  /** Open the server's wake stream to pull soon after remote changes (default true with autoSync). */
  realtimeWakeups?: boolean;
  /** Scheduled pull interval in ms (default 30000). */
  pullIntervalMs?: number;
  /** Entries per pull page (default 1000). */
  pullLimit?: number;
  /** Mutations per push (default 256). */
  maxSlice?: number;
  /** First retry delay in ms, doubled per failure with jitter (default 1000). */
  retryBaseMs?: number;
  /** Largest retry delay in ms (default 60000). */
  retryMaxMs?: number;
  /** Per-request deadline in ms (default 30000). */
  requestTimeoutMs?: number;
  /** Tables whose pending writes coalesce: only the newest unsent write per key is kept. */
  latestOnlyTables?: string[];
  /** Bytes of a pull run's pages kept in the page's memory until the run commits (default
   * 33554432, 32 MiB); the pages past it wait in IndexedDB, and 0 keeps them all there. */
  stagingMemoryBytes?: number;
  /**
   * Equality indexes: for each table, the columns `query`/`watch` filters (`where`) should find
   * through IndexedDB instead of reading the whole table. Each declared column costs an index entry
   * per row; changing the declaration re-indexes that table's rows once, at `open`.
   */
  indexes?: { [T in TableName<DB>]?: Extract<keyof RowOf<DB, T>, string>[] };
}

export interface WriteOptions {
  /** Hold the write until this time (Date or ms since epoch, years 1 to 9999); the server answers DELAYED before it. */
  applyAfter?: Date | number;
  /** Override the table's latest-only setting for this write. */
  latestOnly?: boolean;
}

/** One member of `batch(writes)`: an upsert, patch or delete of one row of one table. */
export type BatchWrite<DB extends object = AnyTables> = {
  [T in TableName<DB>]:
    | { op: "upsert"; table: T; pk: string; row: Partial<RowOf<DB, T>> }
    | { op: "patch"; table: T; pk: string; columns: Partial<RowOf<DB, T>> }
    | { op: "delete"; table: T; pk: string };
}[TableName<DB>];

export interface Checkpoint {
  cursor: string | null; horizon: number; committedAt: number | null;
  /**
   * The bucket set the local rows are the server's state of. After `open` with other `buckets`,
   * it names the old set until the pull that brings the new one commits.
   */
  buckets: string[];
}
export interface SyncHealth {
  failureStreak: number; lastError: string | null; lastSuccessAt: number | null; inFlight: boolean; online: boolean;
  /** This tab runs the sync loops for every tab of this database. */
  leader: boolean;
}
export interface SyncStatus { pending: number; retrying: number; deadLetters: number; applied: number; rejected: number; skipped: number; delayed: number; }
export interface SyncReport { pushes: number; pulled: boolean; pushError: { code: ErrorCode; message: string; status: number | null } | null; }
export interface QueryFilter<R extends object = Row> {
  /** Columns that must equal these values (as `===` compares them; a value of `undefined` is refused: `null` finds null). */
  where?: Partial<R>;
  /** Only rows the server placed in this bucket (and rows written here that no pull has placed yet). */
  bucket?: string;
  /**
   * The column the rows come in the order of (ascending), or `[column, "asc" | "desc"]`; without
   * it, primary-key order. Across types: a missing column and null first, then false, true,
   * numbers, strings (by code point), then arrays and objects; equal values in primary-key order.
   */
  orderBy?: (keyof R & string) | readonly [keyof R & string, "asc" | "desc"];
  /** At most this many rows, the first ones in that order: a whole number of at least 1. */
  limit?: number;
}

/** A write waiting in the outbox. */
export interface PendingWrite {
  seq: number; id: string; table: string; pk: string; op: "upsert" | "patch" | "delete"; columns: Row | null;
  /** Shared by the members of one atomic batch. */
  batch: string | null;
  applyAfter: number | null; createdAt: number;
  /** The committed horizon when the write was made. */
  readSeq: number;
  /** Has gone on the wire at least once (it is then never coalesced away). */
  sent: boolean;
  attempts: number;
  /** Consecutive permanent refusals; at 5 the write becomes a dead letter. */
  permanentFailures: number;
  retryAt: number | null; lastError: string | null;
  /** The write's origin hybrid logical clock, which orders columns in a table of `hlc` conflict mode. */
  hlc: string;
  /** A newer write to the same key may replace this one while it is unsent. */
  latestOnly: boolean;
}

export interface DeadLetter { entry: PendingWrite; error: string; deadAt: number; }
export interface Conflict {
  table: string; pk: string; column: string; loser: unknown; winner: unknown;
  loserSeq?: number | null; winnerSeq: number; loserBy?: string | null;
}

/** Why the server refused one write (the `rejected` event). */
export type RejectReason = "DELETE_WINS" | "RLS_DENIED" | "VALIDATION_FAILED" | "CONSTRAINT_VIOLATION" | "SCHEMA_MISMATCH" | "BATCH_ABORTED";

/** The payload of each event. */
export interface KizunaEvents {
  /**
   * Rows changed. A pull that changes more than 10,000 rows lists 10,000 of them in `keys` and names
   * in `tables` the tables in which more changed: re-read those whole.
   */
  change: { origin: "local" | "remote" | "compensation"; keys: { table: string; pk: string }[]; tables?: string[] };
  /** `seq` is the server's commit number (null for a write the server had already pruned from its ledger), `bucket` the bucket it placed the row in. */
  applied: { id: string; table: string; pk: string; seq: number | null; bucket: string | null };
  rejected: { reason: RejectReason; message: string | null; mutation: PendingWrite; serverRow: Row | null };
  deadLetter: { entry: PendingWrite; error: string };
  pushFailed: { code: ErrorCode; message: string; retryable: boolean };
  pullFailed: { code: ErrorCode; message: string; retryable: boolean };
  /**
   * A pull run's progress. `total` is the server's count of the entries the run will deliver,
   * given with the first page (null when the server does not say); on the closing page
   * `entries === total`, so progress ends at 100%.
   */
  pullProgress: { pages: number; entries: number; total: number | null };
  checkpoint: { cursor: string; horizon: number };
  conflicts: { conflicts: Conflict[] };
  checkpointExpired: Record<string, never>;
  serverReset: Record<string, never>;
  rehydrated: { horizon: number };
}
export type KizunaEventName = keyof KizunaEvents;

declare global {
  /**
   * Empty where the app's `lib` has no explicit resource management (ES2023 and older), so the
   * client is `Disposable` (usable with `using`) exactly where the language has it.
   */
  interface Disposable {}
}

/**
 * An offline-first client over one IndexedDB database, generic over the app's tables:
 * `KizunaClient.open<Tables>(...)` types every read and write by table name.
 * Reads and writes return promises; the status methods (getCheckpoint, getSyncHealth, status,
 * pendingWrites, deadLetters), on, watch and close answer at once.
 */
export class KizunaClient<DB extends object = AnyTables> {
  private constructor();
  /**
   * Answers at once. Closes the client as close() does (its engine's wasm memory let go); later
   * calls are refused with CLIENT_CLOSED, as after close().
   */
  free(): void;
  /**
   * Returns a promise of the client. Opens (or creates) the local database and restores the
   * outbox; starts the sync loops unless `autoSync: false`. Every tab may open the same database:
   * one of them, the leader, runs the sync loops for all.
   */
  static open<DB extends object = AnyTables>(options: ClientOptions<DB>): Promise<KizunaClient<DB>>;
  /**
   * Returns a promise, settled once the write is stored locally (the server comes later).
   * Creates the row, or assigns the columns it names when the row exists (the others keep their values).
   */
  put<T extends TableName<DB>>(table: T, pk: string, row: Partial<RowOf<DB, T>>, options?: WriteOptions): Promise<void>;
  /** Returns a promise, settled once stored locally. Assigns only the named columns of an existing row. */
  patch<T extends TableName<DB>>(table: T, pk: string, columns: Partial<RowOf<DB, T>>, options?: WriteOptions): Promise<void>;
  /** Returns a promise, settled once stored locally. Deletes the row locally and queues the delete. */
  delete<T extends TableName<DB>>(table: T, pk: string, options?: WriteOptions): Promise<void>;
  /** Returns a promise, settled once stored locally. Several writes as one atomic group, locally and on the server. */
  batch(writes: BatchWrite<DB>[]): Promise<void>;
  /** Returns a promise of the visible row, or null. */
  get<T extends TableName<DB>>(table: T, pk: string): Promise<RowOf<DB, T> | null>;
  /** Returns a promise of every visible row of a table. */
  list<T extends TableName<DB>>(table: T): Promise<RowOf<DB, T>[]>;
  /** Returns a promise of the visible rows of a table matching the filter, in its order. */
  query<T extends TableName<DB>>(table: T, filter?: QueryFilter<RowOf<DB, T>>): Promise<RowOf<DB, T>[]>;
  /**
   * Answers at once with a function that unsubscribes. Calls `listener` soon after the call
   * (asynchronously) with the rows `query(table, filter)` gives, then again after each committed
   * change that alters them, made in this tab or another. A bad argument throws at once a
   * KizunaError with code INVALID_ARGUMENT.
   */
  watch<T extends TableName<DB>>(table: T, filter: QueryFilter<RowOf<DB, T>> | undefined, listener: (rows: RowOf<DB, T>[]) => void): () => void;
  /** Returns a promise of the report. Pushes what is due, then pulls to the next committed checkpoint (through the leader tab). */
  sync(): Promise<SyncReport>;
  /** Returns a promise: whether a checkpoint was committed. Pulls to the next committed checkpoint without pushing. */
  pull(): Promise<boolean>;
  /** Answers at once: the committed checkpoint. */
  getCheckpoint(): Checkpoint;
  /** Answers at once: the sync loops' health, and whether this tab is the leader. */
  getSyncHealth(): SyncHealth;
  /** Answers at once: the outbox counters. */
  status(): SyncStatus;
  /** Answers at once: the writes waiting in the outbox, oldest first. */
  pendingWrites(): PendingWrite[];
  /** Answers at once: the writes the server refused five times. */
  deadLetters(): DeadLetter[];
  /** Returns a promise. Puts a dead letter back in the outbox. */
  requeueDeadLetter(seq: number): Promise<void>;
  /** Returns a promise. Drops a dead letter and restores the server's row. */
  discardDeadLetter(seq: number): Promise<void>;
  /**
   * Answers at once with a function that unsubscribes. Subscribes to an event. The events that say
   * what became of writes (applied, rejected, deadLetter, conflicts) are kept with the commit that
   * decided them until told: those a page closed or reloaded before telling are told by the next
   * client to open the database, to its first listener of each name (at least once: one the
   * closing page told may be told again; the payload's id tells them apart).
   */
  on<K extends KizunaEventName>(name: K, listener: (event: KizunaEvents[K]) => void): () => void;
  /**
   * Answers at once. Stops the loops and closes the database; listeners hear nothing more. Pending
   * writes stay in the outbox. status(), pendingWrites(), deadLetters() and getSyncHealth() keep
   * answering what they said then, and the client's copy of the outbox leaves wasm memory as soon
   * as its last step has ended, whether or not the app keeps the object.
   */
  close(): void;
}
export interface KizunaClient<DB extends object = AnyTables> extends Disposable {}
"#;
