-- Kizuna SQL pack, file 1 of 10: roles, schemas, auth helpers, settings and the pack's own tables.
--
-- Idempotent: every statement can run again on an installed database. Later files hold the
-- functions; this one holds only state, so re-running the pack never loses data.

-- The three PostgREST roles. On Supabase they exist already; on plain PostgreSQL we create them
-- NOLOGIN (the gateway switches to them with SET LOCAL ROLE). service_role bypasses RLS as on Supabase.
-- A role that exists is left alone (an installer without CREATEROLE, as on a hosted project, must
-- not try). Roles belong to the cluster, so installs into two databases at once may both find one
-- missing: the loser of that race finds it made and goes on.
do $$
declare
  r record;
begin
  for r in select * from (values ('anon', ''), ('authenticated', ''), ('service_role', 'bypassrls')) v(name, extra) loop
    continue when exists (select 1 from pg_roles where rolname = r.name);
    begin
      begin
        execute format('create role %I nologin %s', r.name, r.extra);
      exception when insufficient_privilege then
        execute format('create role %I nologin', r.name);  -- BYPASSRLS needs a superuser
      end;
    exception when duplicate_object or unique_violation then null;
    end;
  end loop;
  -- The installing user is the one the gateway connects as: it must be able to SET ROLE to them.
  -- A superuser can already; anyone else gets membership (best effort: needs CREATEROLE/admin).
  if not (select rolsuper from pg_roles where rolname = current_user) then
    begin
      execute format('grant anon, authenticated, service_role to %I', current_user);
    exception when others then
      raise notice 'kizuna: could not grant the API roles to %: %', current_user, sqlerrm;
    end;
  end if;
end
$$;

create schema if not exists auth;
create schema if not exists kizuna;

-- What an install changes in the pack's own tables, only where it is not so already. ALTER TABLE
-- ... ADD COLUMN IF NOT EXISTS and CREATE INDEX IF NOT EXISTS lock the table (ACCESS EXCLUSIVE,
-- SHARE) even when there is nothing to do, and every start of a gateway installs: a file's
-- transaction took those locks one table after another, and a push committing meanwhile (it
-- holds kizuna.commits from its number to its commit, and writes kizuna.state after) deadlocked
-- with it, and the gateway did not start (the history checker's restarts, about 1 in 40 histories).
create or replace function kizuna.ensure_column(rel regclass, col name, definition text) returns void
language plpgsql set search_path = pg_catalog, pg_temp as $$
begin
  if not exists (select 1 from pg_attribute a where a.attrelid = rel and a.attname = col and not a.attisdropped) then
    execute format('alter table %s add column if not exists %I %s', rel, col, definition);
  end if;
end
$$;

-- Index kizuna.<name> `on ...` (the rest of its CREATE INDEX), unless it exists.
create or replace function kizuna.ensure_index(name text, definition text) returns void
language plpgsql set search_path = pg_catalog, pg_temp as $$
begin
  if to_regclass(format('kizuna.%I', name)) is null then
    execute format('create index if not exists %I %s', name, definition);
  end if;
end
$$;

-- Trigger `trigger_name` of `rel` enabled ALWAYS (it fires in replica sessions too), unless it is.
create or replace function kizuna.ensure_enabled_always(rel regclass, trigger_name name) returns void
language plpgsql set search_path = pg_catalog, pg_temp as $$
begin
  if exists (select 1 from pg_trigger t where t.tgrelid = rel and t.tgname = trigger_name and t.tgenabled <> 'A') then
    execute format('alter table %s enable always trigger %I', rel, trigger_name);
  end if;
end
$$;
grant usage on schema auth to anon, authenticated, service_role;
grant usage on schema kizuna to anon, authenticated, service_role;

-- auth.uid() / auth.jwt() exactly as Supabase defines them, created only when missing so that a
-- Supabase project keeps its own. They read the claims the gateway (or PostgREST) set for the
-- transaction, so Supabase-style policies run unchanged on plain PostgreSQL.
do $$
begin
  if to_regprocedure('auth.jwt()') is null then
    execute $f$
      create function auth.jwt() returns jsonb language sql stable as
      'select coalesce(nullif(current_setting(''request.jwt.claim'', true), ''''),
                       nullif(current_setting(''request.jwt.claims'', true), ''''))::jsonb'
    $f$;
  end if;
  if to_regprocedure('auth.uid()') is null then
    execute $f$
      create function auth.uid() returns uuid language sql stable as
      'select coalesce(nullif(current_setting(''request.jwt.claim.sub'', true), ''''),
                       (nullif(current_setting(''request.jwt.claims'', true), '''')::jsonb ->> ''sub''))::uuid'
    $f$;
  end if;
  if to_regprocedure('auth.role()') is null then
    execute $f$
      create function auth.role() returns text language sql stable as
      'select coalesce(nullif(current_setting(''request.jwt.claim.role'', true), ''''),
                       (nullif(current_setting(''request.jwt.claims'', true), '''')::jsonb ->> ''role''))::text'
    $f$;
  end if;
end
$$;
grant execute on function auth.jwt(), auth.uid(), auth.role() to anon, authenticated, service_role;

-- Settings: one row, typed columns. Change with UPDATE kizuna.settings SET ...; read at each use.
create table if not exists kizuna.settings (
  id boolean primary key default true check (id),
  ledger_retention interval not null default '7 days',      -- verdict ledger entries older than this are pruned
  tombstone_retention interval not null default '30 days',  -- tombstones (and bucket-leave entries) older than this
  journal_retention interval not null default '30 days',    -- conflict-journal entries older than this
  max_row_bytes integer not null default 65536,             -- a mutation's columns larger than this: KZP04
  hlc_max_skew interval not null default '60 seconds',      -- origin HLCs are clamped to now() + this
  max_pull_limit integer not null default 10000,            -- a pull's limit is capped at this
  max_page_bytes bigint not null default 8388608,           -- a pull page's rows take about this many bytes at most (one row always goes)
  max_pull_buckets integer not null default 256,            -- a pull naming more buckets: KZP01
  max_progress_count integer not null default 1000000,      -- entries a run's first page counts for its total (0: none counted)
  default_max_batch_size integer not null default 500       -- for requests naming no registered table
);
select kizuna.ensure_column('kizuna.settings', 'max_pull_buckets', $d$integer not null default 256$d$);
select kizuna.ensure_column('kizuna.settings', 'max_progress_count', $d$integer not null default 1000000$d$);
select kizuna.ensure_column('kizuna.settings', 'max_page_bytes', $d$bigint not null default 8388608$d$);
insert into kizuna.settings default values on conflict do nothing;
grant select on kizuna.settings to anon, authenticated, service_role;

-- Durable server state: one row. Written only under the fence lock (see 004_fence.sql).
create table if not exists kizuna.state (
  id boolean primary key default true check (id),
  epoch text not null default substr(replace(gen_random_uuid()::text, '-', ''), 1, 16),
  db_identity text,                        -- database oid + cluster id at install: a restore changes it
  low_watermark bigint not null default 0, -- the largest sequence number of a pruned tombstone
  applied_total bigint not null default 0,
  replayed_total bigint not null default 0,
  skipped_total bigint not null default 0,
  delayed_total bigint not null default 0,
  rejected_total jsonb not null default '{}',  -- reason -> count
  ledger_pruned_total bigint not null default 0,
  tombstones_pruned_total bigint not null default 0,
  last_reap_at timestamptz,
  installed_at timestamptz not null default now()
);
-- The key that seals pull cursors naming entries the caller may not see (006_pull.sql); never
-- leaves the database. 32 bytes from two random uuids (gen_random_uuid draws from a strong source).
select kizuna.ensure_column('kizuna.state', 'cursor_key',
  $d$bytea not null default decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')$d$);
insert into kizuna.state default values on conflict do nothing;

-- A restored or copied database is another server history: give it a new epoch so that every
-- client's cursor answers SERVER_RESET. Checked at each install (the gateway installs at start).
do $$
declare
  ident text := (select oid::text from pg_database where datname = current_database());
begin
  begin
    ident := ident || ':' || (select system_identifier::text from pg_control_system());
  exception when others then null;  -- not permitted on some hosted services: the oid alone
  end;
  update kizuna.state
     set epoch = case when db_identity is null then epoch
                      else substr(replace(gen_random_uuid()::text, '-', ''), 1, 16) end,
         db_identity = ident
   where db_identity is distinct from ident;
end
$$;

-- Commit sequence numbers: one per committing transaction that changed a synced table.
create sequence if not exists kizuna.commit_seq as bigint;

-- The numbers of committed transactions that changed a synced table; the largest visible one is the
-- horizon (kizuna.horizon()). Each transaction inserts its own row instead of updating one shared
-- row, so a plain-SQL writer at REPEATABLE READ or SERIALIZABLE never fails to commit just because
-- another synced transaction committed after its snapshot. The reaper keeps only the newest row.
create table if not exists kizuna.commits (seq bigint primary key);
-- The transaction that drew the number (kizuna.fence_now checks its own against it).
select kizuna.ensure_column('kizuna.commits', 'xid', $d$xid8$d$);
-- Earlier pack versions kept the horizon in kizuna.state: carry it over once.
do $$
begin
  if exists (select 1 from information_schema.columns
              where table_schema = 'kizuna' and table_name = 'state' and column_name = 'horizon') then
    insert into kizuna.commits (seq) select horizon from kizuna.state where horizon > 0 on conflict do nothing;
    alter table kizuna.state drop column horizon;
  end if;
end
$$;

-- Registry of synced tables. Filled by kizuna.register_table (003_registry.sql).
create table if not exists kizuna.synced_tables (
  name text collate "C" primary key,    -- the table's name on the wire
  rel regclass not null unique,
  pk_column name not null,
  bucket_expr text not null,            -- admin SQL over the row's columns; returns the bucket (text) or null
  conflict_mode text not null default 'arrival' check (conflict_mode in ('arrival', 'hlc')),
  max_batch_size integer not null default 500 check (max_batch_size > 0),
  journal boolean not null default false,
  gate regprocedure,                    -- validation gate: fn(op text, row jsonb) returns boolean
  compiled_version integer not null default 0,
  registered_at timestamptz not null default now()
);
-- The functions the bucket expression calls (by oid), for the set-based push path (005_push_runs.sql);
-- null when the expression reads a table (a subquery) or could not be analysed: such tables take
-- the per-mutation path. Filled by kizuna.compile_table.
select kizuna.ensure_column('kizuna.synced_tables', 'bucket_functions', $d$oid[]$d$);
-- Whether the bucket expression's text may follow the writing session's settings (a date or time
-- it renders: DateStyle, TimeZone; a float: extra_float_digits; kizuna.tree_follows_settings):
-- such a table's bucket is computed under fixed settings (kizuna.fixed_settings), and it takes the
-- per-mutation push path. Filled by kizuna.compile_table; null until then.
select kizuna.ensure_column('kizuna.synced_tables', 'bucket_follows_settings', $d$boolean$d$);
-- The table's columns (names and types, kizuna.table_shape) when it was last registered: a
-- registration that finds them changed announces every row again (kizuna.register_table).
select kizuna.ensure_column('kizuna.synced_tables', 'shape', $d$text$d$);
-- The key column's attribute number, which a rename keeps: a migration that renames the key
-- column is followed under the new name (kizuna.follow_migration). Set by kizuna.compile_table.
select kizuna.ensure_column('kizuna.synced_tables', 'pk_attnum', $d$smallint$d$);
grant select on kizuna.synced_tables to anon, authenticated, service_role;

-- Changes made by the current transaction, captured by the row triggers and numbered at commit.
-- UNLOGGED: rows live only inside their own transaction.
create unlogged table if not exists kizuna.pending (
  id bigserial primary key,
  xid xid8 not null,
  tbl text collate "C" not null,
  pk text collate "C" not null,
  old_bucket text collate "C",   -- bucket before this row event (null: absent or in no bucket)
  new_bucket text collate "C",   -- bucket after (null: deleted or in no bucket)
  image jsonb,                   -- the row as it was, when it left old_bucket (tombstone image)
  changed_cols text[],           -- versioned tables only (hlc mode or journal on)
  hlc text,                      -- the origin HLC a push stamped on this write, if any
  writer text
);
select kizuna.ensure_index('pending_xid', $i$on kizuna.pending (xid)$i$);

-- One row per transaction with pending changes: its insert queues the commit-time fence trigger.
create unlogged table if not exists kizuna.tx_marker (xid xid8 primary key);

-- Synced tables whose entries a transaction numbers as it commits, by the fence, which holds its
-- lock only from then: every live entry (`every_entry`: a migration taken up, kizuna.take_up_shape)
-- or those a registration's backfill wrote (kizuna.register_table, kizuna.unnumbered()).
create unlogged table if not exists kizuna.announcing (xid xid8 not null, tbl text collate "C" not null, primary key (xid, tbl));
select kizuna.ensure_column('kizuna.announcing', 'every_entry', $d$boolean not null default true$d$);

-- The change log: the latest entry per (table, key, bucket). Live entries are rendered through the
-- caller's SELECT policy at pull time; tombstones keep the row image they left with.
create table if not exists kizuna.changes (
  tbl text collate "C" not null,
  pk text collate "C" not null,
  bucket text collate "C" not null,
  seq bigint not null,
  deleted boolean not null default false,
  entered_seq bigint,            -- when the key last entered this bucket (DELETE_WINS rule)
  image jsonb,                   -- tombstones: the row as it left the bucket
  changed_at timestamptz not null default now(),
  primary key (tbl, pk, bucket)
);
select kizuna.ensure_index('changes_bucket_seq', $i$on kizuna.changes (bucket, seq, tbl, pk)$i$);
select kizuna.ensure_index('changes_tombstones', $i$on kizuna.changes (changed_at) where deleted$i$);

-- Per-column versions, for tables in hlc mode or with the conflict journal on.
create table if not exists kizuna.column_versions (
  tbl text collate "C" not null,
  pk text collate "C" not null,
  col text collate "C" not null,
  seq bigint not null,
  hlc text not null,
  writer text,
  primary key (tbl, pk, col)
);
-- The device whose push wrote the column (null: plain SQL): its own value is no conflict for it.
select kizuna.ensure_column('kizuna.column_versions', 'client', $d$uuid$d$);

-- Client registry: each client id belongs to one caller; last_mutation_id is the response field,
-- pruned_seq the highest client_seq whose verdict the reaper removed (the SKIPPED test).
create table if not exists kizuna.clients (
  client_id uuid primary key,
  owner text not null,
  last_mutation_id bigint not null default 0,
  pruned_seq bigint not null default 0,
  created_at timestamptz not null default now(),
  last_seen timestamptz not null default now()
);

-- The verdict ledger, keyed by mutation id. verdict is null while the claiming transaction runs.
create table if not exists kizuna.ledger (
  id uuid primary key,
  client_id uuid not null,
  client_seq bigint not null,
  verdict jsonb,
  created_at timestamptz not null default now()
);
select kizuna.ensure_index('ledger_created', $i$on kizuna.ledger (created_at)$i$);

-- What each client was served, per bucket (the DELETE_WINS rule, see 005_push.sql).
create table if not exists kizuna.client_buckets (
  client_id uuid not null,
  bucket text collate "C" not null,
  joined bigint not null,     -- the checkpoint the client's view of this bucket starts from (0: complete)
  served_to bigint not null,  -- the horizon of the last run served to completion
  primary key (client_id, bucket)
);

-- The conflict journal (tables with journal on): the value a contested column lost.
create table if not exists kizuna.conflicts (
  id bigserial primary key,
  tbl text collate "C" not null,
  pk text collate "C" not null,
  col text collate "C" not null,
  loser jsonb,
  winner jsonb,
  loser_seq bigint,
  winner_seq bigint,           -- null until the recording transaction is numbered
  loser_by text,
  winner_by text,
  recorded_seq bigint,         -- the commit that recorded it: pull attaches entries by this
  xid xid8,
  created_at timestamptz not null default now()
);
select kizuna.ensure_index('conflicts_recorded', $i$on kizuna.conflicts (recorded_seq)$i$);
select kizuna.ensure_index('conflicts_unnumbered', $i$on kizuna.conflicts (xid) where recorded_seq is null$i$);
