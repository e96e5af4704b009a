-- Kizuna SQL pack, file 10 of 10: universe sync's source outbox.
--
-- A database holding Kizuna tables (the source universe) copies the writes of selected tables into
-- another Kizuna deployment (the target), for regional read models, a staging copy or an analytics
-- replica, with eventual convergence and nothing lost. This file is the source side; the target is
-- an ordinary Kizuna deployment, written through its kizuna_push by `kizuna-server universe-sync`.
--
-- 1. kizuna.register_universe_table(...) compiles, per table, kizuna."universe_image_<oid>"(row)
--    (the row as the target gets it, or null when the row filter leaves it out),
--    kizuna."universe_after_<oid>"(row) (its apply_after) and an AFTER ROW trigger,
--    kizuna_universe, that queues each change of a selected row in kizuna.universe_pending
--    (UNLOGGED: rows live only inside their own transaction) and marks its transaction in
--    kizuna.universe_marker. Plain SQL writes go through the same trigger: every caller's write
--    appends its event in its own transaction (the seed's putSynced).
-- 2. That mark queues kizuna.universe_fold(), a DEFERRABLE INITIALLY DEFERRED constraint trigger
--    that runs at COMMIT, inside the writing transaction: under the commit fence's lock (004) it
--    numbers the transaction's events from kizuna.universe_event_seq in write order, and for
--    latest-only tables deletes the key's older pending events. The lock is held until the commit
--    is visible, so events become visible in id order: a run that has seen id N never meets an
--    id below N later. The sequence lives apart from the events, so pruning every event and
--    restarting never reuses an id (a crash may skip ids; it never goes back).
-- 3. `universe-sync` reads pending events in id order (kizuna.universe_window), sends them as
--    upserts and deletes of full row images (kizuna.universe_mutations), and writes back what the
--    target answered (kizuna.universe_record). The delivery policy is the engine's
--    (crates/engine/src/universe.rs over outbox_policy.rs): the same rules as the browser outbox.
--
-- An event is pending (acked_at null, not a dead letter), acknowledged (acked_at set: APPLIED or
-- SKIPPED), or a dead letter (kept until an operator requeues or discards it; never acknowledged,
-- never pruned by kizuna.universe_prune_acked()).

create table if not exists kizuna.universe_tables (
  rel regclass primary key,
  target_table text not null,               -- the table's name on the target's wire
  pk_column name not null,
  row_filter text,                          -- admin SQL over the row's columns; null: every row
  apply_after text,                         -- admin SQL over the row's columns giving a timestamptz
  latest_only boolean not null default false,
  max_attempts integer not null default 20 check (max_attempts > 0),
  compiled_version integer not null default 0,
  registered_at timestamptz not null default now()
);

-- One row: the universe's identity on targets and the durable counters (written by the sync
-- process and the operator's functions, never by application writes).
create table if not exists kizuna.universe_state (
  id boolean primary key default true check (id),
  universe_id uuid not null default gen_random_uuid(),  -- client_id (and token sub) on the target
  epoch text,                                           -- the kizuna.state epoch universe_id is for
  applied_total bigint not null default 0,
  skipped_total bigint not null default 0,
  dead_lettered_total bigint not null default 0,
  requeued_total bigint not null default 0,
  discarded_total bigint not null default 0,
  pruned_total bigint not null default 0,
  last_sync_at timestamptz,
  last_ack_at timestamptz
);
insert into kizuna.universe_state default values on conflict do nothing;

-- The next event id, stored apart from the live events.
create sequence if not exists kizuna.universe_event_seq as bigint;

create table if not exists kizuna.universe_events (
  id bigint primary key,                         -- client_seq on the target
  key uuid not null default gen_random_uuid(),   -- the mutation id on the target (idempotency key)
  source_table regclass not null,
  target_table text collate "C" not null,
  pk text collate "C" not null,
  op text not null check (op in ('upsert', 'delete')),
  columns jsonb,                                 -- upsert: the row image; delete: null
  apply_after timestamptz,
  latest_only boolean not null default false,
  created_at timestamptz not null default now(),
  attempts integer not null default 0,           -- consecutive failed delivery attempts
  max_attempts integer not null,
  retry_at timestamptz,
  dead_letter boolean not null default false,
  error text,                                    -- the last failure or refusal, CODE: message
  acked_at timestamptz,
  ack text check (ack in ('APPLIED', 'SKIPPED'))
);
select kizuna.ensure_index('universe_events_pending',
  $i$on kizuna.universe_events (id) where acked_at is null and not dead_letter$i$);
select kizuna.ensure_index('universe_events_pending_key',
  $i$on kizuna.universe_events (target_table, pk)
     where acked_at is null and not dead_letter$i$);
select kizuna.ensure_index('universe_events_acked', $i$on kizuna.universe_events (id) where acked_at is not null$i$);
select kizuna.ensure_index('universe_events_dead', $i$on kizuna.universe_events (id) where dead_letter$i$);

create unlogged table if not exists kizuna.universe_pending (
  pid bigserial primary key,
  xid xid8 not null,
  source_table regclass not null,
  target_table text collate "C" not null,
  pk text collate "C" not null,
  op text not null,
  columns jsonb,
  apply_after timestamptz,
  latest_only boolean not null,
  max_attempts integer not null
);
select kizuna.ensure_index('universe_pending_xid', $i$on kizuna.universe_pending (xid)$i$);
create unlogged table if not exists kizuna.universe_marker (xid xid8 primary key);

-- ---------------------------------------------------------------------------------------------
-- Registry and compiled capture.

-- Bump when the compiled template changes: installs recompile every registered table once.
create or replace function kizuna.universe_compile_version() returns integer language sql immutable as 'select 9';

create or replace function kizuna.universe_compile(table_rel regclass) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  t kizuna.universe_tables;
  oid_ text := table_rel::oid::text;
  generated text[];
  image_fn text := 'universe_image_' || table_rel::oid;
  after_fn text := 'universe_after_' || table_rel::oid;
  key_fn text := 'universe_key_' || table_rel::oid;
  after_old text;
  after_new text;
begin
  select * into strict t from kizuna.universe_tables where rel = table_rel;
  -- Generated columns are computed on the target, never sent (the target refuses them). The row is
  -- `$1`, never its name beside the columns in scope: a column named `kz_row` read as it, and such
  -- a table's rows were never queued.
  generated := array(select a.attname::text from pg_attribute a
                      where a.attrelid = table_rel and a.attnum > 0 and not a.attisdropped and a.attgenerated <> '');
  execute format('create or replace function kizuna.%I(kz_row %s) returns jsonb language sql stable
                  set search_path = pg_catalog, public, pg_temp as %L',
    image_fn, table_rel,
    format('select case when %s then to_jsonb($1) - %L::text[] end from (select (kz_row).*) as kz_cols',
           coalesce('coalesce((' || t.row_filter || ')::boolean, false)', 'true'), generated));
  execute format('create or replace function kizuna.%I(kz_row %s) returns timestamptz language sql stable
                  set search_path = pg_catalog, public, pg_temp as %L',
    after_fn, table_rel,
    format('select (%s)::timestamptz from (select (kz_row).*) as kz_cols', coalesce(t.apply_after, 'null')));

  -- The key of a row as text: read as `new.<key>`, its type stayed in the trigger's cached plans
  -- past a migration that changed it (kizuna.compile_table's place function says more). Spelled by
  -- no session's settings (kizuna.spell_key_sql): a date key written by a session in DateStyle
  -- 'SQL, DMY' reached the target as 07/12/2026, which it read as July 12.
  execute format('create or replace function kizuna.%I(kz_row %s) returns text language sql stable
                  set search_path = pg_catalog, public, pg_temp as %L',
    key_fn, table_rel,
    'select ' || kizuna.spell_column_sql(table_rel, t.pk_column, '(kz_row)'));

  -- The apply_after of a row, or a constant null when the table has no expression (no call per row).
  after_old := case when t.apply_after is null then 'null' else format('kizuna.%I(old)', after_fn) end;
  after_new := case when t.apply_after is null then 'null' else format('kizuna.%I(new)', after_fn) end;
  execute format($f$
    create or replace function kizuna.%1$I() returns trigger
    language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $cap$
    declare
      x xid8 := pg_current_xact_id();
      oi jsonb; ni jsonb; opk text; npk text;
    begin
      if tg_op <> 'INSERT' then oi := kizuna.%2$I(old); opk := kizuna.%4$I(old); end if;
      if tg_op <> 'DELETE' then ni := kizuna.%2$I(new); npk := kizuna.%4$I(new); end if;
      if oi is null and ni is null then
        return null;  -- outside the selection before and after
      end if;
      -- The outbox indexes a key (see the capture in 003_registry.sql): refused in the write's
      -- statement, not at commit with PostgreSQL's words naming the index.
      if npk is distinct from opk and octet_length(coalesce(npk, '')) > 2400 then  -- a key it had is indexed already
        raise exception 'a key of a table registered for universe sync must stay under 2,400 bytes'
          using errcode = '54000';
      end if;
      -- Leaving the selection, or a key change: the target deletes the old key.
      if oi is not null and (ni is null or opk is distinct from npk) then
        insert into kizuna.universe_pending (xid, source_table, target_table, pk, op, columns, apply_after, latest_only, max_attempts)
        values (x, %5$L, %6$L, opk, 'delete', null, %3$s, %7$L, %8$L);
      end if;
      if ni is not null then
        insert into kizuna.universe_pending (xid, source_table, target_table, pk, op, columns, apply_after, latest_only, max_attempts)
        values (x, %5$L, %6$L, npk, 'upsert', ni, %9$s, %7$L, %8$L);
      end if;
      -- Mark the transaction once (the mark queues the fold at commit); a setting remembers it,
      -- set first: with constraints set immediate the fold runs inside the insert below, and
      -- unsets it (kizuna.universe_fold) so the next write marks the transaction again.
      if current_setting('kizuna.universe_marked', true) is distinct from x::text then
        perform set_config('kizuna.universe_marked', x::text, true);
        insert into kizuna.universe_marker (xid) values (x) on conflict do nothing;
      end if;
      return null;
    end
    $cap$
  $f$, 'universe_capture_' || oid_, image_fn, after_old, key_fn, table_rel::oid, t.target_table,
       t.latest_only, t.max_attempts, after_new);
  execute format('create or replace trigger kizuna_universe after insert or update or delete on %s
                  for each row execute function kizuna.%I()', table_rel, 'universe_capture_' || oid_);
  -- TRUNCATE fires no row triggers: it would bypass the outbox.
  execute format('create or replace trigger kizuna_universe_no_truncate before truncate on %s
                  for each statement execute function kizuna.refuse_truncate(%L, %L, %L)', table_rel,
                 'registered for universe sync', 'its outbox', 'kizuna.unregister_universe_table');
  -- In replica sessions too (see 003_registry.sql).
  execute format('alter table %s enable always trigger kizuna_universe, enable always trigger kizuna_universe_no_truncate', table_rel);
  execute format('revoke all on function kizuna.%I(%s), kizuna.%I(%s), kizuna.%I(%s), kizuna.%I() from public',
                 image_fn, table_rel, after_fn, table_rel, key_fn, table_rel, 'universe_capture_' || oid_);
  update kizuna.universe_tables set compiled_version = kizuna.universe_compile_version() where rel = table_rel;
end
$$;

-- Registers (or re-registers) a table for universe sync.
--   tbl           the table (single-column primary key, or pass pk_column)
--   row_filter    SQL expression over the row's columns: only rows for which it is true are copied;
--                 a row that stops matching is deleted on the target. Null: every row.
--   latest_only   keep only the newest pending event per key (replaced in the writing transaction)
--   apply_after   SQL expression over the row's columns giving a timestamptz: the target answers
--                 DELAYED before it (events then apply in apply_after order, not write order)
--   max_attempts  failed delivery attempts before an event is a dead letter
--   target_table  the table's name on the target's wire; default: the table's own name
--   backfill      also queue every row now in the selection (to fill a new target)
create or replace function kizuna.register_universe_table(
  tbl regclass,
  row_filter text default null,
  latest_only boolean default false,
  apply_after text default null,
  max_attempts integer default 20,
  target_table text default null,
  pk_column name default null,
  backfill boolean default false
) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  key_col name := pk_column;
  wire text := coalesce(target_table, (select relname from pg_class where oid = tbl));
begin
  if key_col is null then
    select a.attname into key_col
      from pg_index i join pg_attribute a on a.attrelid = i.indrelid and a.attnum = i.indkey[0]
     where i.indrelid = tbl and i.indisprimary and i.indnatts = 1;
    if key_col is null then
      raise exception 'kizuna.register_universe_table: % has no single-column primary key; pass pk_column', tbl;
    end if;
  elsif kizuna.column_type(tbl, key_col) is null then
    raise exception 'kizuna.register_universe_table: % has no column %', tbl, key_col;
  end if;
  if max_attempts is null or max_attempts < 1 then
    raise exception 'kizuna.register_universe_table: max_attempts must be at least 1';
  end if;
  insert into kizuna.universe_tables as u (rel, target_table, pk_column, row_filter, apply_after, latest_only, max_attempts)
  values (tbl, wire, key_col, row_filter, apply_after, latest_only, max_attempts)
  on conflict (rel) do update
    set target_table = excluded.target_table, pk_column = excluded.pk_column, row_filter = excluded.row_filter,
        apply_after = excluded.apply_after, latest_only = excluded.latest_only, max_attempts = excluded.max_attempts;
  perform kizuna.universe_compile(tbl);
  if backfill then
    execute format($q$
      insert into kizuna.universe_pending (xid, source_table, target_table, pk, op, columns, apply_after, latest_only, max_attempts)
      select pg_current_xact_id(), $1, $2, kizuna.%5$I(r), 'upsert', i.image, kizuna.%4$I(r), $3, $4
        from %2$s r cross join lateral (select kizuna.%3$I(r) as image) i
       where i.image is not null order by r.%1$I
    $q$, key_col, tbl, 'universe_image_' || tbl::oid, 'universe_after_' || tbl::oid, 'universe_key_' || tbl::oid)
    using tbl, wire, latest_only, max_attempts;
    insert into kizuna.universe_marker (xid) values (pg_current_xact_id()) on conflict do nothing;
  end if;
end
$$;

-- Stops capturing a table's writes. Its pending events are still delivered.
create or replace function kizuna.unregister_universe_table(tbl regclass) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
begin
  execute format('drop trigger if exists kizuna_universe on %s', tbl);
  execute format('drop trigger if exists kizuna_universe_no_truncate on %s', tbl);
  execute format('drop function if exists kizuna.%I()', 'universe_capture_' || tbl::oid);
  execute format('drop function if exists kizuna.%I(%s)', 'universe_image_' || tbl::oid, tbl);
  execute format('drop function if exists kizuna.%I(%s)', 'universe_after_' || tbl::oid, tbl);
  execute format('drop function if exists kizuna.%I(%s)', 'universe_key_' || tbl::oid, tbl);
  delete from kizuna.universe_tables where rel = tbl;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- The commit-time fold: numbers the transaction's events and coalesces latest-only keys.

create or replace function kizuna.universe_fold() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  x xid8 := pg_current_xact_id();
begin
  if not exists (select 1 from kizuna.universe_marker where xid = x) then
    return null;  -- already folded by an earlier firing in this transaction
  end if;
  -- The fence's lock (004), so that a transaction writing synced and universe tables takes one
  -- lock, never two in either order; held until the commit is visible: ids become visible in order.
  perform pg_advisory_xact_lock(kizuna.fence_lock_key());

  -- Latest-only: the key's older pending events leave the outbox with this commit.
  delete from kizuna.universe_events e
   using (select distinct p.target_table, p.pk from kizuna.universe_pending p where p.xid = x and p.latest_only) k
   where e.target_table = k.target_table and e.pk = k.pk
     and e.acked_at is null and not e.dead_letter and e.latest_only;

  -- Ids in write order; of a latest-only key's events in this transaction only the last one.
  insert into kizuna.universe_events (id, source_table, target_table, pk, op, columns, apply_after, latest_only, max_attempts)
  select nextval('kizuna.universe_event_seq'), q.source_table, q.target_table, q.pk, q.op, q.columns, q.apply_after,
         q.latest_only, q.max_attempts
    from (select p.* from (
            select p.*, row_number() over (partition by p.target_table, p.pk order by p.pid desc) as newest
              from kizuna.universe_pending p where p.xid = x) p
           where not p.latest_only or p.newest = 1
           order by p.pid) q;

  delete from kizuna.universe_pending where xid = x;
  delete from kizuna.universe_marker where xid = x;
  -- A write later in this transaction (after SET CONSTRAINTS ALL IMMEDIATE, or by an app's own
  -- deferred trigger firing at commit after this one) marks it again and queues another fold: with
  -- the setting left, its events stayed in universe_pending for good, never given an id.
  perform set_config('kizuna.universe_marked', '', true);
  return null;
end
$$;

do $$
begin
  if not exists (select 1 from pg_trigger where tgname = 'kizuna_universe_fold' and tgrelid = 'kizuna.universe_marker'::regclass) then
    create constraint trigger kizuna_universe_fold after insert on kizuna.universe_marker
      deferrable initially deferred for each row execute function kizuna.universe_fold();
  end if;
  perform kizuna.ensure_enabled_always('kizuna.universe_marker', 'kizuna_universe_fold');
end
$$;

-- ---------------------------------------------------------------------------------------------
-- What `universe-sync` calls (as the source's owner).

-- The universe's id on targets. It follows the pack's epoch (001, 007): a database restored or
-- copied elsewhere gets a new epoch, and so a new universe id, under which its pending events get
-- new keys: it is a new client on the target, so no id it reuses can be answered SKIPPED.
create or replace function kizuna.universe_identity() returns uuid
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  s kizuna.universe_state;
  current_epoch text := (select epoch from kizuna.state);
begin
  select * into s from kizuna.universe_state for update;
  if s.epoch is null then
    update kizuna.universe_state set epoch = current_epoch;
  elsif s.epoch <> current_epoch then
    update kizuna.universe_state set epoch = current_epoch, universe_id = gen_random_uuid() returning * into s;
    update kizuna.universe_events set key = gen_random_uuid() where acked_at is null;
  end if;
  return s.universe_id;
end
$$;

-- An apply_after as the wire carries it: RFC 3339 has the years 0001 to 9999, and 'infinity' is
-- no number of milliseconds. A time past 9999 (or infinity) waits until the end of 9999, one before
-- year 1 (or -infinity) is due now, so the event is held or sent as its time says, and reading it
-- fails neither the window nor the request for every event behind it.
create or replace function kizuna.universe_wire_time(t timestamptz) returns timestamptz
language sql immutable as $$
  select case when t is null then null
              else least(greatest(t, '0001-01-01 00:00:00+00'::timestamptz), '9999-12-31 23:59:59.999999+00'::timestamptz) end
$$;

-- Up to n pending events after after_id, in id order, as the delivery policy reads them (times in
-- unix milliseconds).
create or replace function kizuna.universe_window(after_id bigint, n integer)
returns table (id bigint, key uuid, is_delete boolean, apply_after_ms bigint, attempts integer,
               max_attempts integer, retry_at_ms bigint, error text)
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select e.id, e.key, e.op = 'delete', (extract(epoch from kizuna.universe_wire_time(e.apply_after)) * 1000)::bigint, e.attempts,
         e.max_attempts, (extract(epoch from e.retry_at) * 1000)::bigint, e.error
    from kizuna.universe_events e
   where e.acked_at is null and not e.dead_letter and e.id > after_id
   order by e.id
   limit n
$$;

-- Fresh ids (and keys) for the events among `ids` the target answered DELAYED before: stored
-- nowhere there, they would go again under their first id, below events sent and applied since,
-- whose verdicts the target may have pruned (7 days by default): a client_seq at or below the
-- target's pruned one is answered SKIPPED, which acknowledges the event, and the scheduled row
-- never arrived. Under the fence's lock, as the fold numbers events, so ids stay visible in order.
-- Returns (old id, new id, new key) for each event renumbered.
create or replace function kizuna.universe_claim(ids bigint[])
returns table (old_id bigint, new_id bigint, new_key uuid)
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
begin
  if not exists (select 1 from kizuna.universe_events e
                  where e.id = any(ids) and e.acked_at is null and not e.dead_letter
                    and e.attempts = 0 and e.error is null and e.retry_at is not null) then
    return;  -- nothing held: no lock taken on the path of every slice
  end if;
  perform pg_advisory_xact_lock(kizuna.fence_lock_key());
  return query
    with held as (
      select e.id from kizuna.universe_events e
       where e.id = any(ids) and e.acked_at is null and not e.dead_letter
         and e.attempts = 0 and e.error is null and e.retry_at is not null
       order by e.id
         for update
    ), fresh as (
      select h.id as old, nextval('kizuna.universe_event_seq') as new from held h order by h.id
    )
    -- retry_at cleared: claimed once. Sent and applied but never recorded (the process killed),
    -- it goes again under this key, which the target answers from its ledger; a new DELAYED
    -- answer sets retry_at again.
    update kizuna.universe_events e set id = f.new, key = gen_random_uuid(), retry_at = null
      from fresh f where e.id = f.old
    returning f.old, e.id, e.key;
end
$$;

-- The wire mutations of those of these events still pending, in id order, as JSON text, and their
-- ids: the row images go out exactly as stored (jsonb keeps every digit of a number), never
-- re-serialised by the sync process. An event replaced meanwhile by a latest-only write is not sent.
drop function if exists kizuna.universe_mutations(bigint[]);
create or replace function kizuna.universe_mutations(ids bigint[], out sent bigint[], out mutations text)
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  -- In the order of `ids` (the slice's): an event claimed a fresh id keeps its place in it.
  select coalesce(array_agg(e.id order by array_position(ids, e.id)), '{}'),
         coalesce(jsonb_agg(jsonb_build_object(
           'id', e.key, 'client_seq', e.id, 'table', e.target_table, 'pk', e.pk, 'op', e.op, 'read_seq', 0)
           || case when e.columns is null then '{}' else jsonb_build_object('columns', e.columns) end
           || case when e.apply_after is null then '{}' else jsonb_build_object('apply_after',
                to_char(kizuna.universe_wire_time(e.apply_after) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) end
         order by array_position(ids, e.id)), '[]')::text
    from kizuna.universe_events e
   where e.id = any(ids) and e.acked_at is null and not e.dead_letter
$$;

-- Writes back what delivery decided, in one transaction: [{"id", "ack": "APPLIED"|"SKIPPED"}, or
-- {"id", "attempts", "retry_at_ms", "error"} (still pending), or {"id", "dead": true, "attempts",
-- "error"}]. An event replaced meanwhile by a latest-only write is left alone (its successor is
-- pending). Returns the counts recorded.
create or replace function kizuna.universe_record(updates jsonb) returns jsonb
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  n_applied bigint;
  n_skipped bigint;
  n_dead bigint;
begin
  with u as (
    select * from jsonb_to_recordset(updates) as r(id bigint, ack text, attempts integer, retry_at_ms bigint,
                                                    error text, dead boolean)
  ), acked as (
    update kizuna.universe_events e set acked_at = now(), ack = u.ack, retry_at = null, error = null
      from u where e.id = u.id and u.ack is not null and e.acked_at is null and not e.dead_letter
    returning u.ack
  ), changed as (
    update kizuna.universe_events e
       set attempts = u.attempts, error = u.error, dead_letter = coalesce(u.dead, false),
           retry_at = case when coalesce(u.dead, false) then null else to_timestamp(u.retry_at_ms / 1000.0) end
      from u where e.id = u.id and u.ack is null and e.acked_at is null and not e.dead_letter
    returning coalesce(u.dead, false) as died
  )
  select (select count(*) from acked where ack = 'APPLIED'), (select count(*) from acked where ack = 'SKIPPED'),
         (select count(*) from changed where died)
    into n_applied, n_skipped, n_dead;
  update kizuna.universe_state
     set applied_total = applied_total + n_applied, skipped_total = skipped_total + n_skipped,
         dead_lettered_total = dead_lettered_total + n_dead, last_sync_at = now(),
         last_ack_at = case when n_applied + n_skipped > 0 then now() else last_ack_at end;
  return jsonb_build_object('applied', n_applied, 'skipped', n_skipped, 'dead_lettered', n_dead);
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Operator's functions.

-- Removes acknowledged events only (never pending ones, never dead letters). Returns how many.
create or replace function kizuna.universe_prune_acked() returns bigint
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  n bigint;
begin
  delete from kizuna.universe_events where acked_at is not null;
  get diagnostics n = row_count;
  update kizuna.universe_state set pruned_total = pruned_total + n;
  return n;
end
$$;

-- Dead letters, oldest first (ids null: all of them).
create or replace function kizuna.universe_dead_letters(ids bigint[] default null) returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'id', e.id, 'key', e.key, 'source_table', e.source_table::text, 'target_table', e.target_table,
           'pk', e.pk, 'op', e.op, 'columns', e.columns, 'apply_after', e.apply_after, 'created_at', e.created_at,
           'attempts', e.attempts, 'max_attempts', e.max_attempts, 'error', e.error) order by e.id), '[]')
    from kizuna.universe_events e
   where e.dead_letter and (ids is null or e.id = any(ids))
$$;

-- Puts dead letters back in the outbox (ids null: all of them), each as a new event: a new id
-- (the old one may be at or below the target's pruned watermark, where it would be answered
-- SKIPPED without effect) and a new key (the old one may have a recorded refusal), numbered at
-- commit like any write. It carries the key's state as it is now (the row image, or a delete when
-- the row is gone or outside the selection), never the old image: events delivered after the
-- dead one may have moved the target on, and the old image would move it back. Returns how many.
create or replace function kizuna.universe_requeue(ids bigint[] default null) returns integer
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  d kizuna.universe_events;
  t kizuna.universe_tables;
  image jsonb;
  after timestamptz;
  n integer := 0;
begin
  for d in select * from kizuna.universe_events e
            where e.dead_letter and (ids is null or e.id = any(ids)) order by e.id for update loop
    select * into t from kizuna.universe_tables u where u.rel = d.source_table;
    if t.rel is null then
      raise exception 'kizuna: dead letter % is of % which is no longer registered for universe sync; discard it',
        d.id, d.source_table using errcode = 'KZU01';
    end if;
    image := null;
    after := null;
    execute format('select kizuna.%I(r), kizuna.%I(r) from %s r where r.%I = cast($1 as %s)',
                   'universe_image_' || t.rel::oid, 'universe_after_' || t.rel::oid, t.rel, t.pk_column,
                   kizuna.column_type(t.rel, t.pk_column))
      into image, after using d.pk;
    insert into kizuna.universe_pending (xid, source_table, target_table, pk, op, columns, apply_after, latest_only, max_attempts)
    values (pg_current_xact_id(), t.rel, t.target_table, d.pk, case when image is null then 'delete' else 'upsert' end,
            image, case when image is null then null else after end, t.latest_only, t.max_attempts);
    delete from kizuna.universe_events where id = d.id;
    n := n + 1;
  end loop;
  if n > 0 then
    insert into kizuna.universe_marker (xid) values (pg_current_xact_id()) on conflict do nothing;
    update kizuna.universe_state set requeued_total = requeued_total + n;
  end if;
  return n;
end
$$;

-- Drops dead letters for good (ids null: all of them). Returns how many.
create or replace function kizuna.universe_discard(ids bigint[] default null) returns integer
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  n integer;
begin
  delete from kizuna.universe_events where dead_letter and (ids is null or id = any(ids));
  get diagnostics n = row_count;
  update kizuna.universe_state set discarded_total = discarded_total + n;
  return n;
end
$$;

-- The source outbox's figures (the seed's universeSync* counters): pending, retrying (pending with a
-- failed attempt), delayed (pending, apply_after ahead), dead_letters, acknowledged (not pruned
-- yet), and the durable totals. Counts read the outbox's partial indexes.
create or replace function kizuna.universe_status() returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select jsonb_build_object(
    'universe_id', s.universe_id,
    'tables', (select count(*) from kizuna.universe_tables),
    'pending', (select count(*) from kizuna.universe_events where acked_at is null and not dead_letter),
    'retrying', (select count(*) from kizuna.universe_events where acked_at is null and not dead_letter and attempts > 0),
    'delayed', (select count(*) from kizuna.universe_events
                 where acked_at is null and not dead_letter and apply_after > now()),
    'dead_letters', (select count(*) from kizuna.universe_events where dead_letter),
    'acknowledged', (select count(*) from kizuna.universe_events where acked_at is not null),
    'applied_total', s.applied_total,
    'skipped_total', s.skipped_total,
    'dead_lettered_total', s.dead_lettered_total,
    'requeued_total', s.requeued_total,
    'discarded_total', s.discarded_total,
    'pruned_total', s.pruned_total,
    'last_event_id', (select case when is_called then last_value else 0 end from kizuna.universe_event_seq),
    'oldest_pending_at', (select min(created_at) from kizuna.universe_events where acked_at is null and not dead_letter),
    'oldest_pending_age_seconds', coalesce(extract(epoch from now() - (select min(created_at) from kizuna.universe_events
                                                                         where acked_at is null and not dead_letter)), 0),
    'last_sync_at', s.last_sync_at,
    'last_ack_at', s.last_ack_at)
  from kizuna.universe_state s
$$;

-- Admin only: none of this is for the API roles (007 granted them the functions that existed then;
-- these are new, so only PUBLIC's default grant is revoked, and theirs for a re-install).
revoke all on function
  kizuna.universe_compile(regclass),
  kizuna.register_universe_table(regclass, text, boolean, text, integer, text, name, boolean),
  kizuna.unregister_universe_table(regclass),
  kizuna.universe_fold(),
  kizuna.universe_identity(),
  kizuna.universe_window(bigint, integer),
  kizuna.universe_claim(bigint[]),
  kizuna.universe_mutations(bigint[]),
  kizuna.universe_record(jsonb),
  kizuna.universe_prune_acked(),
  kizuna.universe_dead_letters(bigint[]),
  kizuna.universe_requeue(bigint[]),
  kizuna.universe_discard(bigint[]),
  kizuna.universe_status()
from public, anon, authenticated, service_role;

-- A new pack version may change the compiled template: recompile what an older one compiled.
do $$
declare
  r regclass;
begin
  for r in select rel from kizuna.universe_tables where compiled_version < kizuna.universe_compile_version() loop
    perform kizuna.universe_compile(r);
  end loop;
end
$$;
