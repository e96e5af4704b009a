//! The package's TypeScript declarations, written by hand: the client class is generic over the
//! app's tables, which wasm-bindgen cannot express, so its generated declaration is skipped.

use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** A row: column name to JSON value. */
export type Row = Record<string, unknown>;

export interface ClientOptions {
  /** IndexedDB database name; one per user and app. */
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
  /** Mutations per push (default 64). */
  maxSlice?: number;
  /** First retry delay in ms, doubled per failure with jitter (default 1000). */
  retryBaseMs?: number;
  /** Largest retry delay in ms (default 60000). */
  retryMaxMs?: number;
  /** Per-request deadline in ms (default 30000). */
  requestTimeoutMs?: number;
  /** Tables whose pending writes coalesce: only the newest unsent write per key is kept. */
  latestOnlyTables?: string[];
}

export interface WriteOptions {
  /** Hold the write until this time (Date or ms since epoch); the server answers DELAYED before it. */
  applyAfter?: Date | number;
  /** Override the table's latest-only setting for this write. */
  latestOnly?: boolean;
}

export type BatchWrite =
  | { op: "upsert"; table: string; pk: string; row: Row }
  | { op: "patch"; table: string; pk: string; columns: Row }
  | { op: "delete"; table: string; pk: string };

export interface Checkpoint { cursor: string | null; horizon: number; committedAt: number | null; }
export interface SyncHealth { failureStreak: number; lastError: string | null; lastSuccessAt: number | null; inFlight: boolean; online: boolean; }
export interface SyncStatus { pending: number; retrying: number; deadLetters: number; applied: number; rejected: number; skipped: number; delayed: number; }
export interface SyncReport { pushes: number; pulled: boolean; pushError: { code: string; message: string; status: number | null } | null; }
export interface QueryFilter {
  /** Columns that must equal these values. */
  where?: Row;
  /** Only rows the server placed in this bucket (and rows written here that no pull has placed yet). */
  bucket?: string;
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
}

export interface DeadLetter { entry: PendingWrite; error: string; deadAt: number; }
export interface Conflict {
  table: string; pk: string; column: string; loser: unknown; winner: unknown;
  loserSeq?: number | null; winnerSeq: number; loserBy?: string | null;
}

/** The payload of each event. */
export interface KizunaEvents {
  change: { origin: "local" | "remote" | "compensation"; keys: { table: string; pk: string }[] };
  applied: { id: string; table: string; pk: string; seq: number | null };
  rejected: { reason: "DELETE_WINS" | "RLS_DENIED" | "VALIDATION_FAILED" | "CONSTRAINT_VIOLATION" | "SCHEMA_MISMATCH" | "BATCH_ABORTED"; message: string | null; mutation: PendingWrite; serverRow: Row | null };
  deadLetter: { entry: PendingWrite; error: string };
  pushFailed: { code: string; message: string; retryable: boolean };
  pullFailed: { code: string; message: string; retryable: boolean };
  pullProgress: { pages: number; entries: number };
  checkpoint: { cursor: string; horizon: number };
  conflicts: { conflicts: Conflict[] };
  checkpointExpired: Record<string, never>;
  serverReset: Record<string, never>;
  rehydrated: { horizon: number };
}
export type KizunaEventName = keyof KizunaEvents;

/** An offline-first client over one IndexedDB database. */
export class KizunaClient {
  private constructor();
  free(): void;
  [Symbol.dispose](): void;
  /** Opens (or creates) the local database and restores the outbox; starts the sync loops unless `autoSync: false`. */
  static open(options: ClientOptions): Promise<KizunaClient>;
  /** Creates the row, or assigns the columns it names when the row exists. */
  put(table: string, pk: string, row: Row, options?: WriteOptions): Promise<void>;
  /** Assigns only the named columns of an existing row. */
  patch(table: string, pk: string, columns: Row, options?: WriteOptions): Promise<void>;
  /** Deletes the row locally and queues the delete. */
  delete(table: string, pk: string, options?: WriteOptions): Promise<void>;
  /** Several writes as one atomic group. */
  batch(writes: BatchWrite[]): Promise<void>;
  /** The visible row, or null. */
  get(table: string, pk: string): Promise<Row | null>;
  /** Every visible row of a table. */
  list(table: string): Promise<Row[]>;
  /** Visible rows of a table matching the filter. */
  query(table: string, filter?: QueryFilter): Promise<Row[]>;
  /** Pushes what is due, then pulls to the next committed checkpoint. */
  sync(): Promise<SyncReport>;
  /** Pulls to the next committed checkpoint without pushing. */
  pull(): Promise<boolean>;
  getCheckpoint(): Checkpoint;
  getSyncHealth(): SyncHealth;
  status(): SyncStatus;
  pendingWrites(): PendingWrite[];
  deadLetters(): DeadLetter[];
  requeueDeadLetter(seq: number): Promise<void>;
  discardDeadLetter(seq: number): Promise<void>;
  /** Subscribes to an event; returns a function that unsubscribes. */
  on<K extends KizunaEventName>(name: K, listener: (event: KizunaEvents[K]) => void): () => void;
  /** Stops the loops and closes the database. Pending writes stay in the outbox. */
  close(): void;
}
"#;
