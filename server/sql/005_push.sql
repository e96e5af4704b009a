-- Kizuna SQL pack, file 5 of 10: push.
--
-- public.kizuna_push(request jsonb) runs as the caller (SECURITY INVOKER): every read and write of a
-- user table goes through the caller's privileges and Row Level Security. The pack's own tables
-- are reached only through the small SECURITY DEFINER helpers below.
--
-- Per mutation, in the order sent:
--   recorded verdict for its id          -> that verdict, replayed: true, no effect
--   unknown id, client_seq <= pruned_seq  -> SKIPPED (its verdict was pruned: it had its effect)
--   apply_after in the future            -> DELAYED, nothing stored
--   otherwise the mutation runs in its own savepoint, so one refusal does not undo the others;
--   consecutive plain mutations run together as one set-based statement with the same outcome
--   (005_push_runs.sql). Members of an atomic batch share one savepoint: the first refusal undoes
--   them all and the others answer BATCH_ABORTED.
-- These answers are decided for the whole request first (nothing a mutation applies changes them).
-- The push locks its client's row, so a duplicate arriving on another connection waits for this one
-- and then replays; the verdicts are recorded in the ledger at the end, in one statement.
--
-- Rejections: SCHEMA_MISMATCH (unknown table/column, wrong type), DELETE_WINS / RLS_DENIED (see
-- kizuna.key_state), VALIDATION_FAILED (the table's gate), CONSTRAINT_VIOLATION (SQLSTATE class 23),
-- RLS_DENIED (SQLSTATE 42501, or no row affected). server_row is always the row as the caller's
-- SELECT renders it after the refusal, or null.
--
-- Ops: upsert inserts the row (unnamed columns take their defaults) or, when the key exists,
-- assigns the named columns; patch assigns the named columns of an existing row and never creates
-- one; delete removes the row, leaving a tombstone. A key that has a tombstone and no live entry is
-- deleted for push: writes to it are refused, never resurrected (except by a universe-sync source,
-- which replicates writes already judged elsewhere, like a plain SQL writer: kizuna.is_universe_source).

-- ---------------------------------------------------------------------------------------------
-- Request shape: whole-request errors KZP01 (malformed), KZP03 (protocol), KZP02, KZP04.

-- Both are false, never null, for a missing field: `not null` is null, which would let it through.
-- (Written without counted repetitions, which make PostgreSQL's regular expressions about three
-- times slower; every mutation of every push passes these.)
-- 8-4-4-4-12 hex digits: 36 characters, hex or hyphens, hyphens exactly at 9, 14, 19 and 24.
create or replace function kizuna.is_uuid_text(s text) returns boolean language sql immutable as $$
  select coalesce(length(s) = 36 and s ~ '^[0-9a-fA-F-]+$'
     and substr(s, 9, 1) = '-' and substr(s, 14, 1) = '-' and substr(s, 19, 1) = '-'
     and substr(s, 24, 1) = '-' and length(replace(s, '-', '')) = 32, false)
$$;

create or replace function kizuna.is_uuid(v jsonb) returns boolean language sql immutable as $$
  select coalesce(jsonb_typeof(v) = 'string' and kizuna.is_uuid_text(v #>> '{}'), false)
$$;

-- An optional minus and 1 to 18 digits: a JSON number that is whole as written (1.0 is not) and
-- under 10^18 in size. (Read from the number rather than matched in its text: cheaper, same answer.)
create or replace function kizuna.is_int(v jsonb) returns boolean language sql immutable as $$
  select coalesce(jsonb_typeof(v) = 'number' and scale(v::numeric) = 0 and abs(v::numeric) < 1e18, false)
$$;

-- Protocol version and client id, common to push and pull.
create or replace function kizuna.check_envelope(request jsonb) returns void language plpgsql as $$
begin
  if jsonb_typeof(request) is distinct from 'object' then
    perform kizuna.fail('KZP01', 'the request must be a JSON object');
  end if;
  if jsonb_typeof(request -> 'protocol') is distinct from 'number' then
    perform kizuna.fail('KZP01', 'protocol must be a number', null, 'send "protocol": 1');
  end if;
  if (request -> 'protocol')::numeric <> 1 then
    perform kizuna.fail('KZP03', format('unsupported protocol version %s', request -> 'protocol'),
                        null, 'this server speaks protocol 1');
  end if;
  if not kizuna.is_uuid(request -> 'client_id') then
    perform kizuna.fail('KZP01', 'client_id must be a UUID string');
  end if;
end
$$;

create or replace function kizuna.check_push_request(request jsonb) returns void language plpgsql as $$
declare
  m jsonb;
  i bigint;
  what text;
  n integer;
  cap integer;
  largest integer;
  repeats boolean;
  falls boolean;
  tables text[];
  max_bytes integer := (select max_row_bytes from kizuna.settings);
begin
  perform kizuna.check_envelope(request);
  if jsonb_typeof(request -> 'mutations') is distinct from 'array' then
    perform kizuna.fail('KZP01', 'mutations must be an array');
  end if;
  -- The first mutation that is malformed, and what is wrong with it (checks in this order).
  select o - 1, x.what into i, what
    from jsonb_array_elements(request -> 'mutations') with ordinality as a(e, o)
    cross join lateral (select case
      when jsonb_typeof(e) <> 'object' then 'must be an object'
      when jsonb_typeof(e -> 'id') is distinct from 'string' or not kizuna.is_uuid_text(e ->> 'id')
        then 'id must be a UUID string'
      when not kizuna.is_int(e -> 'client_seq') then 'client_seq must be an integer'
      when (e ->> 'client_seq')::bigint < 1 then 'client_seq must be at least 1'
      when jsonb_typeof(e -> 'table') is distinct from 'string' then 'table must be a string'
      when jsonb_typeof(e -> 'pk') is distinct from 'string' then 'pk must be a string'
      when (e ->> 'op') is null or (e ->> 'op') not in ('upsert', 'patch', 'delete')
        or jsonb_typeof(e -> 'op') <> 'string' then 'op must be "upsert", "patch" or "delete"'
      when coalesce(jsonb_typeof(e -> 'columns'), 'null') not in ('null', 'object') then 'columns must be an object'
      when coalesce(jsonb_typeof(e -> 'hlc'), 'null') not in ('null', 'string')
        or (jsonb_typeof(e -> 'hlc') = 'string' and not kizuna.hlc_is_valid(e ->> 'hlc'))
        then 'hlc must look like <13-digit ms>-<4-digit counter>-<node>'
      when not kizuna.is_int(e -> 'read_seq') then 'read_seq must be an integer'
      when (e ->> 'read_seq')::bigint < 0 then 'read_seq must not be negative'
      when coalesce(jsonb_typeof(e -> 'batch'), 'null') <> 'null' and not kizuna.is_uuid(e -> 'batch')
        then 'batch must be a UUID string'
      when coalesce(jsonb_typeof(e -> 'apply_after'), 'null') not in ('null', 'string')
        or (jsonb_typeof(e -> 'apply_after') = 'string'
            and (e ->> 'apply_after') !~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:?\d{2})$')
        then 'apply_after must be an RFC 3339 timestamp string'
    end as what) x
   where x.what is not null order by o limit 1;
  -- An apply_after of the right shape that is still no time (a 13th month), before that one.
  for m, n in select e, o - 1 from jsonb_array_elements(request -> 'mutations') with ordinality as a(e, o)
               where jsonb_typeof(e -> 'apply_after') = 'string' and (i is null or o - 1 < i) order by o loop
    begin
      perform (m ->> 'apply_after')::timestamptz;
    exception when others then
      i := n;
      what := 'apply_after must be an RFC 3339 timestamp string';
      exit;
    end;
  end loop;
  if what is not null then
    perform kizuna.fail('KZP01', format('mutations[%s]: %s', i, what));
  end if;

  -- Within one request: ids never repeat (each is its own idempotency key) and client_seq rises
  -- in issue order, as the contract requires of every client. One pass finds whether anything is
  -- wrong, with the request's tables and its largest row; which mutation is found only then.
  select count(distinct (e ->> 'id')::uuid) < count(*), coalesce(bool_or(s <= prev), false),
         array_agg(distinct e ->> 'table'), max(bytes), count(*)
    into repeats, falls, tables, largest, n
    from (select e, (e ->> 'client_seq')::bigint as s, lag((e ->> 'client_seq')::bigint) over (order by o) as prev,
                 octet_length(coalesce(e -> 'columns', 'null')::text) as bytes
            from jsonb_array_elements(request -> 'mutations') with ordinality a(e, o)) d;
  if repeats then
    select format('mutations[%s]: id %s repeats mutations[%s]', o - 1, e ->> 'id', first_o - 1) into what
      from (select e, o, min(o) over (partition by (e ->> 'id')::uuid) as first_o
              from jsonb_array_elements(request -> 'mutations') with ordinality a(e, o)) d
     where o > first_o order by o limit 1;
  elsif falls then
    select format('mutations[%s]: client_seq %s is not above the %s before it', o - 1, s, prev) into what
      from (select o, (e ->> 'client_seq')::bigint as s,
                   lag((e ->> 'client_seq')::bigint) over (order by o) as prev
              from jsonb_array_elements(request -> 'mutations') with ordinality a(e, o)) d
     where s <= prev order by o limit 1;
  end if;
  if what is not null then
    perform kizuna.fail('KZP01', what, null, 'every mutation needs its own id and a client_seq above the one before');
  end if;

  select coalesce(min(t.max_batch_size), (select default_max_batch_size from kizuna.settings)) into cap
    from kizuna.synced_tables t where t.name = any (tables);
  if n > cap then
    perform kizuna.fail('KZP02', format('%s mutations exceed max_batch_size %s', n, cap),
                        null, 'send at most ' || cap || ' mutations per request');
  end if;
  if largest > max_bytes then
    select o - 1, octet_length((e -> 'columns')::text) into i, n
      from jsonb_array_elements(request -> 'mutations') with ordinality as a(e, o)
     where octet_length(coalesce(e -> 'columns', 'null')::text) > max_bytes order by o limit 1;
    perform kizuna.fail('KZP04', format('mutations[%s]: row of %s bytes exceeds max_row_bytes %s', i, n, max_bytes));
  end if;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Bookkeeping helpers (SECURITY DEFINER: callers have no rights on kizuna's tables).
--
-- The API roles may execute these, since the entry points run as the caller and call them. So none
-- takes the caller's identity as an argument: it is kizuna.caller(), from the request's claims, and
-- a helper acting for a client id first checks that the client belongs to the caller.

create or replace function kizuna.check_own_client(client uuid) returns void
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
begin
  if not exists (select 1 from kizuna.clients k where k.client_id = client and k.owner = kizuna.caller()) then
    perform kizuna.fail('KZP01', 'client_id belongs to another user', null, 'generate a client id per user and device');
  end if;
end
$$;

-- Binds a client id to its caller and locks the client's row for this push: pushes of one client
-- run one after another. A client id owned by another caller is KZP01.
drop function if exists kizuna.touch_client(uuid, text, boolean);
create or replace function kizuna.touch_client(client uuid, for_push boolean) returns kizuna.clients
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  who text := kizuna.caller();
  c kizuna.clients;
begin
  if for_push then
    insert into kizuna.clients as k (client_id, owner) values (client, who)
    on conflict (client_id) do update set last_seen = now() where k.owner = excluded.owner
    returning * into c;
  else
    insert into kizuna.clients (client_id, owner) values (client, who) on conflict do nothing;
    select * into c from kizuna.clients k where k.client_id = client and k.owner = who;
  end if;
  if c.client_id is null then
    perform kizuna.fail('KZP01', 'client_id belongs to another user', null, 'generate a client id per user and device');
  end if;
  return c;
end
$$;

create or replace function kizuna.ledger_lookup(mutation uuid, client uuid) returns jsonb
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  l kizuna.ledger;
begin
  perform kizuna.check_own_client(client);
  select * into l from kizuna.ledger where id = mutation;
  if l.id is null then
    return null;
  end if;
  if l.client_id <> client then
    perform kizuna.fail('KZP01', format('mutation id %s belongs to another client', mutation));
  end if;
  return l.verdict;
end
$$;

-- Claims a mutation id; false when another transaction recorded it first (it waits for that one).
create or replace function kizuna.ledger_claim(mutation uuid, client uuid, cseq bigint) returns boolean
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  claimed uuid;
begin
  perform kizuna.check_own_client(client);
  insert into kizuna.ledger (id, client_id, client_seq) values (mutation, client, cseq)
  on conflict (id) do nothing returning id into claimed;
  return claimed is not null;
end
$$;

-- The recorded verdicts of a request's mutations, by position (null: none). An id recorded for
-- another client is KZP01: the first one in the order mutations are reached in (an atomic batch at
-- its first member's position).
drop function if exists kizuna.recorded_verdicts(uuid, uuid[]);
create or replace function kizuna.recorded_verdicts(client uuid, muts jsonb) returns jsonb[]
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  foreign_id text;
  found jsonb[];
  foreign_found boolean;
begin
  perform kizuna.check_own_client(client);
  select array_agg(case when l.client_id = client then l.verdict end order by a.o), coalesce(bool_or(l.client_id <> client), false)
    into found, foreign_found
    from jsonb_array_elements(muts) with ordinality a(e, o)
    -- One index lookup per mutation; the limit keeps the planner from turning it back into a join.
    -- As a join, the planner, which cannot tell how many mutations a request holds, hashed the
    -- whole ledger at every push: a sequential scan of every id ever pushed (2 ms at 9,000 rows).
    left join lateral (select l.client_id, l.verdict from kizuna.ledger l where l.id = (a.e ->> 'id')::uuid limit 1) l on true;
  if foreign_found then
    -- Which one: the first in the order mutations are reached in, looked up as above.
    select a.e ->> 'id' into foreign_id
      from (select e, o, min(o) over (partition by coalesce(e ->> 'batch', o::text)) as first_o
              from jsonb_array_elements(muts) with ordinality x(e, o)) a
     cross join lateral (select l.client_id from kizuna.ledger l where l.id = (a.e ->> 'id')::uuid limit 1) l
     where l.client_id <> client
     order by a.first_o, a.o limit 1;
    perform kizuna.fail('KZP01', format('mutation id %s belongs to another client', foreign_id));
  end if;
  return found;
end
$$;

-- The state of a key for push, without revealing anything: 'live' (it has a live entry), 'deleted'
-- (tombstones only) or 'unknown'; and, for 'deleted', the row images of the tombstones this client
-- was served a live copy of. The DELETE_WINS rule: the client has a complete view of bucket B from
-- before the row entered it (joined < entered_seq), and a checkpoint of the client's stood where the
-- row was live in B: its latest one (entered_seq <= served_to < tombstone seq), or the one the write
-- was made on (entered_seq <= read_seq < tombstone seq, read_seq <= served_to). The caller's SELECT
-- policy must then render the image.
drop function if exists kizuna.key_state(text, text, uuid);
create or replace function kizuna.key_state(table_name text, key text, client uuid, read_seq bigint,
                                            out state text, out seen_images jsonb)
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  perform kizuna.check_own_client(client);
  if exists (select 1 from kizuna.changes c where c.tbl = table_name and c.pk = key and not c.deleted) then
    state := 'live';
  elsif exists (select 1 from kizuna.changes c where c.tbl = table_name and c.pk = key) then
    state := 'deleted';
    select jsonb_agg(c.image) into seen_images
      from kizuna.changes c join kizuna.client_buckets b on b.client_id = client and b.bucket = c.bucket
     where c.tbl = table_name and c.pk = key and c.deleted and c.image is not null
       and b.joined < c.entered_seq
       and ((c.entered_seq <= b.served_to and b.served_to < c.seq)
            or (c.entered_seq <= read_seq and read_seq < c.seq and read_seq <= b.served_to));
  else
    state := 'unknown';
  end if;
end
$$;

-- A universe-sync source (a service_role token with the kizuna_universe claim, see 009) replicates
-- writes made on another database, where they were already judged: like a plain SQL writer, it may
-- create a key again after it was deleted.
create or replace function kizuna.is_universe_source() returns boolean language sql stable as $$
  select coalesce(nullif(current_setting('role', true), 'none') = 'service_role'
                  and nullif(current_setting('request.jwt.claims', true), '')::jsonb ? 'kizuna_universe', false)
$$;

-- Column versions of a key: {"col": {"seq": n, "hlc": "...", "writer": "...", "client": "..."}}.
create or replace function kizuna.versions_of(table_name text, key text) returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select coalesce(jsonb_object_agg(v.col, jsonb_build_object('seq', v.seq, 'hlc', v.hlc, 'writer', v.writer, 'client', v.client)), '{}')
    from kizuna.column_versions v where v.tbl = table_name and v.pk = key
$$;

-- Records a conflict the caller took part in; numbered by the fence at commit (winner_seq null:
-- this transaction's number). Only on a journaled table, against the writer the column's version
-- names (the other party of every conflict a push records: the column's last writer before this
-- write): called by hand, it put made-up conflicts with any user into that user's pulls.
create or replace function kizuna.journal_add(table_name text, key text, col text, loser jsonb, winner jsonb,
                                              loser_seq bigint, winner_seq bigint, loser_by text, winner_by text)
returns void language sql security definer set search_path = pg_catalog, pg_temp as $$
  insert into kizuna.conflicts (tbl, pk, col, loser, winner, loser_seq, winner_seq, loser_by, winner_by, xid)
  select table_name, key, col, loser, winner, loser_seq, winner_seq, loser_by, winner_by, pg_current_xact_id()
   where kizuna.caller() in (loser_by, winner_by)
     and exists (select 1 from kizuna.synced_tables t where t.name = table_name and t.journal)
     and exists (select 1 from kizuna.column_versions v
                  where v.tbl = table_name and v.pk = key and v.col = journal_add.col
                    and v.writer is not distinct from case when kizuna.caller() = loser_by then winner_by else loser_by end)
$$;

-- Numbers the push (when it applied anything), records its verdicts in the ledger, advances the
-- client's last_mutation_id and the durable totals. Returns the PushResponse. The ledger rows are
-- written here, once, with their verdicts: the client's row, locked for the whole push, keeps
-- every other push of this client out, so an id can only have been recorded meanwhile by another
-- client's push (the insert waits for it), which is KZP01 as it would have been at the start.
-- The verdicts come as the array kizuna_push keeps them in: made one JSON array only to be taken
-- apart here again, they cost a push of 256 writes about a millisecond.
drop function if exists kizuna.finish_push(uuid, jsonb);
create or replace function kizuna.finish_push(client uuid, verdicts jsonb[]) returns jsonb
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  s bigint;
  out_verdicts jsonb;
  lmid bigint;
  top_seq bigint;
  fresh_count integer;
  applied integer;
  replayed integer;
  skipped integer;
  delayed integer;
  refused integer;
  rejected jsonb := '{}';
  recorded integer;
  taken text;
begin
  perform kizuna.check_own_client(client);
  select count(*) filter (where (v ->> '_fresh')::boolean),
         count(*) filter (where (v ->> '_fresh')::boolean and v ->> 'status' = 'APPLIED'),
         count(*) filter (where (v ->> 'replayed')::boolean),
         count(*) filter (where v ->> 'status' = 'SKIPPED'),
         count(*) filter (where v ->> 'status' = 'DELAYED'),
         count(*) filter (where (v ->> '_fresh')::boolean and v ->> 'status' = 'REJECTED')
    into fresh_count, applied, replayed, skipped, delayed, refused
    from unnest(verdicts) v;
  if applied > 0 then
    s := kizuna.fence_now();
  else
    perform pg_advisory_xact_lock(kizuna.fence_lock_key());  -- the totals row is written under it
  end if;

  -- The answer's verdicts (APPLIED ones with the commit number), and the ledger rows of the fresh ones.
  with v as (
    select o, (x ->> '_fresh')::boolean as is_fresh, (x ->> '_seq')::bigint as client_seq,
           case when x ->> 'status' = 'APPLIED' and (x ->> '_fresh')::boolean
                then (x - '{_fresh,_seq}'::text[]) || jsonb_build_object('seq', s) else x - '{_fresh,_seq}'::text[] end as verdict
      from unnest(verdicts) with ordinality as a(x, o)
  ), written as (
    insert into kizuna.ledger (id, client_id, client_seq, verdict)
    select (verdict ->> 'id')::uuid, client, client_seq, verdict - 'replayed' from v where is_fresh order by o
    on conflict (id) do nothing returning id
  )
  select coalesce(jsonb_agg(verdict order by o), '[]'), max(client_seq) filter (where is_fresh),
         (select count(*) from written)
    into out_verdicts, top_seq, recorded
    from v;
  if recorded < fresh_count then
    select x ->> 'id' into taken from unnest(verdicts) with ordinality as a(x, o)
     where (x ->> '_fresh')::boolean
       and exists (select 1 from kizuna.ledger l where l.id = (x ->> 'id')::uuid and l.client_id <> client)
     order by o limit 1;
    perform kizuna.fail('KZP01', format('mutation id %s belongs to another client', taken));
  end if;
  if refused > 0 then
    select jsonb_object_agg(r, c) into rejected
      from (select v ->> 'reason' as r, count(*) as c from unnest(verdicts) v
             where v ->> 'status' = 'REJECTED' and (v ->> '_fresh')::boolean
               and kizuna.reason_message(v ->> 'reason') is not null  -- only the protocol's reasons are counted
             group by 1) g;
  end if;

  update kizuna.clients c set last_mutation_id = greatest(c.last_mutation_id, coalesce(top_seq, 0))
   where c.client_id = client
  returning c.last_mutation_id into lmid;

  update kizuna.state st set
    applied_total = applied_total + applied,
    replayed_total = replayed_total + replayed,
    skipped_total = skipped_total + skipped,
    delayed_total = delayed_total + delayed,
    rejected_total = case when refused = 0 then rejected_total else
      (select coalesce(jsonb_object_agg(r, n), '{}') from (
         select r, sum(n)::bigint as n from (
           select key as r, value::bigint as n from jsonb_each_text(st.rejected_total)
           union all
           select key, value::bigint from jsonb_each_text(rejected)) u group by r) g) end;

  return jsonb_build_object('verdicts', out_verdicts, 'last_mutation_id', coalesce(lmid, 0));
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Applying one mutation (as the caller).

-- Why a reason was given, in words an app can show. Never the statement, a value or a row.
create or replace function kizuna.reason_message(reason text) returns text language sql immutable as $$
  select case reason
    when 'DELETE_WINS' then 'the row was deleted on the server'
    when 'RLS_DENIED' then 'the row does not exist or is not yours to write'
    when 'VALIDATION_FAILED' then 'the table''s validation gate refused the row'
    when 'CONSTRAINT_VIOLATION' then 'a constraint of the table refused the row'
    when 'SCHEMA_MISMATCH' then 'the table, a column or a value''s type does not match the server''s schema'
    when 'BATCH_ABORTED' then 'another write of its atomic batch was refused'
  end
$$;

drop function if exists kizuna.rejected(jsonb, text);
create or replace function kizuna.rejected(m jsonb, reason text, message text default null) returns jsonb
language sql immutable as $$
  select jsonb_build_object('id', m -> 'id', 'status', 'REJECTED', 'reason', reason,
                            'message', coalesce(message, kizuna.reason_message(reason)), 'server_row', null,
                            'replayed', false, '_fresh', true, '_seq', m -> 'client_seq')
$$;

-- A value that is no value of its column's type (text for a number, a bad date, too long for
-- varchar(n), out of range): SCHEMA_MISMATCH. Other data exceptions (a division by zero in a
-- trigger) are the application's rules refusing the row.
create or replace function kizuna.is_type_mismatch(state text) returns boolean language sql immutable as $$
  select state in ('22P02', '22003', '22001', '22007', '22008', '22P05', '22021', '22026', '22P03')
$$;

-- The words for an error the application's own SQL raised for one mutation. A RAISE in the app's
-- trigger or function (class P0) speaks for itself; other errors get a fixed sentence, because
-- their text and detail can carry internals (tuple ids, relation names, other rows' values).
create or replace function kizuna.refusal_message(state text, message text, constraint_name text) returns text
language sql immutable as $$
  select case
    when left(state, 2) = 'P0' then message
    when state = '23505' then format('a row with the same value already exists (%s)', constraint_name)
    when state = '23503' then format('a row it refers to does not exist, or others refer to it (%s)', constraint_name)
    when state = '23514' then format('a check constraint refused the row (%s)', constraint_name)
    when state = '23502' then 'a required column is null'
    when left(state, 2) = '23' then format('a constraint of the table refused the row (%s)', constraint_name)
    when left(state, 2) = '54' then 'a value is too large to store: a key and its bucket must stay under 2,400 bytes together, other indexed values under about 2,700'
    when kizuna.is_type_mismatch(state) then 'a value does not fit its column''s type'
    else format('the table''s own rules refused the row (SQLSTATE %s)', state)
  end
$$;

-- The bucket of a row image of a synced table (the registry's compiled bucket function), or null.
create or replace function kizuna.bucket_of(rel regclass, image jsonb) returns text language plpgsql stable as $$
declare
  b text;
begin
  if image is null then
    return null;
  end if;
  execute format('select kizuna.%I(jsonb_populate_record(null::%s, $1))', 'bucket_' || rel::oid, rel) into b using image;
  return b;
end
$$;

-- Applies one mutation inside its own savepoint and returns its verdict (server_row still unset).
create or replace function kizuna.apply_mutation(m jsonb, client uuid, who text) returns jsonb
language plpgsql as $$
declare
  t kizuna.synced_tables;
  op text := m ->> 'op';
  key text := m ->> 'pk';
  cols jsonb := coalesce(nullif(m -> 'columns', 'null'), '{}');  -- "columns": null is no columns
  writable jsonb;
  key_type text;
  col_key text;
  ks record;
  versions jsonb := '{}';
  current_row jsonb;
  h text;
  col text;
  ver jsonb;
  assign text[] := '{}';
  pending_journal jsonb := '[]';
  j jsonb;
  result jsonb;
  inserted boolean;
  ok boolean;
  err_state text;
  err_message text;
  err_constraint text;
  err_context text;
  row_bucket text;
begin
  select * into t from kizuna.synced_tables where name = m ->> 'table';
  if t.name is null then
    return kizuna.rejected(m, 'SCHEMA_MISMATCH', 'the table is not synced');
  end if;
  key_type := kizuna.key_type_of(t);
  if key_type is null then
    return kizuna.rejected(m, 'SCHEMA_MISMATCH', 'the table is not synced');
  end if;
  -- One spelling per key: the change log, the column versions and the key locks compare keys as
  -- text, so a uuid or number sent in another spelling (upper case, leading zeros) must not read as
  -- a key never seen, which would resurrect a deleted row or bypass its column order.
  key := kizuna.key_text(key_type, key);
  if key is null then
    return kizuna.rejected(m, 'SCHEMA_MISMATCH', format('the key is not a valid %s', key_type));
  end if;
  writable := kizuna.writable_columns(t.rel);
  if op <> 'delete' then
    -- The row's own key column, in the key's one spelling too: an upper-case uuid sent as the key
    -- and as the column names one row (it was refused as differing from the key).
    col_key := kizuna.key_text(key_type, cols ->> t.pk_column);  -- null when invalid: refused below
    if exists (select 1 from jsonb_object_keys(cols) k where not writable ? k)
       or (cols ? t.pk_column and col_key is distinct from key) then
      return kizuna.rejected(m, 'SCHEMA_MISMATCH',
        coalesce((select format('the table has no writable column %s', k) from jsonb_object_keys(cols) k
                   where not writable ? k order by k limit 1),
                 'the key column differs from the key'));
    end if;
  end if;
  key := kizuna.stored_key(t.rel, t.pk_column, key_type, key);
  if op <> 'delete' then
    cols := cols || jsonb_build_object(t.pk_column, key);
  end if;

  begin
    if t.conflict_mode = 'hlc' or t.journal then
      -- Concurrent pushes to one key decide per-column order one after another.
      perform pg_advisory_xact_lock(hashtext('kizuna.key'), hashtext(t.name || ':' || key));
      -- Plain SQL writers take no key lock: wait for the row itself, so that a write committing
      -- meanwhile is in the versions read next, and is not overwritten by an older clock.
      if has_table_privilege(t.rel, 'UPDATE') then
        execute format('select 1 from %s t where t.%I = cast($1 as %s) for update', t.rel, t.pk_column, key_type)
          using key;
      end if;
      versions := kizuna.versions_of(t.name, key);
      current_row := kizuna.render_row(t.rel, t.pk_column, key);
    end if;
    ks := kizuna.key_state(t.name, key, client, (m ->> 'read_seq')::bigint);
    if ks.state = 'deleted' and op = 'upsert' and not kizuna.is_universe_source() then
      return kizuna.tombstone_verdict(m, t, ks.seen_images);
    end if;

    -- Column order: which named columns this write assigns (all, except hlc losers).
    h := case when t.conflict_mode = 'hlc' then kizuna.hlc_clamp(coalesce(m ->> 'hlc', kizuna.hlc_now())) end;
    for col in select k from jsonb_object_keys(cols) k where k <> t.pk_column order by k loop
      ver := versions -> col;
      if current_row is not null and ver is not null and h is not null
         and h collate "C" <= (ver ->> 'hlc') collate "C" then
        -- hlc mode: an older origin clock loses this column.
        if t.journal and (current_row -> col) is distinct from (cols -> col) then
          pending_journal := pending_journal || jsonb_build_object('col', col, 'loser', cols -> col,
            'winner', current_row -> col, 'loser_seq', null, 'winner_seq', ver -> 'seq',
            'loser_by', who, 'winner_by', ver ->> 'writer');
        end if;
      else
        assign := assign || col;
        if t.journal and current_row is not null and ver is not null
           and (m ->> 'read_seq')::bigint < (ver ->> 'seq')::bigint
           and (ver ->> 'client') is distinct from client::text
           and (current_row -> col) is distinct from (cols -> col) then
          -- A value the writer had not seen is overwritten: it loses. A device has seen the values
          -- its own pushes wrote, also those above the checkpoint it wrote on.
          pending_journal := pending_journal || jsonb_build_object('col', col, 'loser', current_row -> col,
            'winner', cols -> col, 'loser_seq', ver -> 'seq', 'winner_seq', null,
            'loser_by', ver ->> 'writer', 'winner_by', who);
        end if;
      end if;
    end loop;

    -- What the capture trigger stamps on this write's column versions.
    perform set_config('kizuna.hlc', coalesce(h, ''), true);
    perform set_config('kizuna.insert_cols', (select jsonb_agg(k) from jsonb_object_keys(cols) k)::text, true);
    perform set_config('kizuna.update_cols', to_jsonb(assign)::text, true);
    if op = 'upsert' then
      execute format('insert into %1$s as t (%2$s) select %2$s from jsonb_populate_record(null::%1$s, $1)
                      on conflict (%3$I) do update set %4$s returning to_jsonb(t), t.xmax::text = ''0''',
                     t.rel,
                     (select string_agg(format('%I', k), ', ') from jsonb_object_keys(cols) k),
                     t.pk_column,
                     coalesce((select string_agg(format('%1$I = excluded.%1$I', c), ', ') from unnest(assign) c),
                              format('%1$I = excluded.%1$I', t.pk_column)))
        into result, inserted using cols;
      -- A delete that committed while this insert waited for the row it removed (READ COMMITTED;
      -- versioned tables lock the row before reading the key's state, above): the insert found
      -- no row and created one, a deleted key come back with only this write's columns. Read
      -- again now that the delete is visible; if the key is deleted, so is this insert.
      if inserted and not (t.conflict_mode = 'hlc' or t.journal) and not kizuna.is_universe_source() then
        ks := kizuna.key_state(t.name, key, client, (m ->> 'read_seq')::bigint);
        if ks.state = 'deleted' then
          raise exception 'the key was deleted while this write waited' using errcode = 'KZD01';
        end if;
      end if;
    elsif op = 'patch' then
      execute format('update %1$s as t set %2$s from jsonb_populate_record(null::%1$s, $1) as r
                      where t.%3$I = cast($2 as %4$s) returning to_jsonb(t)',
                     t.rel,
                     coalesce((select string_agg(format('%1$I = r.%1$I', c), ', ') from unnest(assign) c),
                              format('%1$I = t.%1$I', t.pk_column)),
                     t.pk_column, key_type)
        into result using cols, key;
    else
      execute format('delete from %1$s as t where t.%2$I = cast($1 as %3$s) returning to_jsonb(t)',
                     t.rel, t.pk_column, key_type)
        into result using key;
    end if;
    perform set_config('kizuna.hlc', '', true);
    perform set_config('kizuna.insert_cols', '', true);
    perform set_config('kizuna.update_cols', '', true);

    if result is null then
      -- No row affected: the key is absent, deleted, or the caller's policy hides or protects it
      -- (read again: a delete that committed while this write waited is visible now).
      ks := kizuna.key_state(t.name, key, client, (m ->> 'read_seq')::bigint);
      if ks.state = 'deleted' then
        return kizuna.tombstone_verdict(m, t, ks.seen_images);
      end if;
      return kizuna.rejected(m, 'RLS_DENIED');
    end if;

    if t.gate is not null then
      -- A gate refuses by returning false, or by raising: KZV01, or a plain RAISE EXCEPTION (P0001),
      -- which is how a gate written in plpgsql says no. Any other error is judged below as any error
      -- of the write (a fault of the server fails the request).
      begin
        execute (select format('select %I.%I($1, $2)', n.nspname, p.proname)
                   from pg_proc p join pg_namespace n on n.oid = p.pronamespace where p.oid = t.gate)
          into ok using op, result;
      exception when raise_exception then
        -- A plain RAISE's words are the refusal's message (README: an app's RAISE speaks for
        -- itself); a gate raising KZV01 reaches the handler below with its own words.
        get stacked diagnostics err_message = message_text;
        ok := false;
      end;
      if ok is not true then
        raise exception '%', coalesce(err_message, kizuna.reason_message('VALIDATION_FAILED')) using errcode = 'KZV01';
      end if;
    end if;

    for j in select e from jsonb_array_elements(pending_journal) e loop
      perform kizuna.journal_add(t.name, key, j ->> 'col', j -> 'loser', j -> 'winner',
        (j ->> 'loser_seq')::bigint, (j ->> 'winner_seq')::bigint, j ->> 'loser_by', j ->> 'winner_by');
    end loop;
    -- The row's bucket after the write, so the client can place its own row before a pull does.
    if op <> 'delete' then
      row_bucket := kizuna.bucket_of(t.rel, result);
    end if;
    -- `pk`: the key's one spelling when it was sent in another (an upper-case uuid), so the writer
    -- moves its row there: the pull brings the row under it, and the row under the spelling sent
    -- would stay a second one on the device.
    return jsonb_strip_nulls(jsonb_build_object('id', m -> 'id', 'status', 'APPLIED', 'replayed', false,
                              'bucket', row_bucket, 'pk', nullif(key, m ->> 'pk'),
                              '_fresh', true, '_seq', m -> 'client_seq'));
  exception
    when sqlstate 'KZD01' then return kizuna.tombstone_verdict(m, t, ks.seen_images);
    when sqlstate 'KZV01' then
      get stacked diagnostics err_message = message_text;
      return kizuna.rejected(m, 'VALIDATION_FAILED', err_message);
    when insufficient_privilege then return kizuna.rejected(m, 'RLS_DENIED');
    when undefined_column or datatype_mismatch or cannot_coerce or sqlstate '428C9' then
      get stacked diagnostics err_context = pg_exception_context;
      perform kizuna.fail_if_raised_in_registration(t, err_context);
      return kizuna.rejected(m, 'SCHEMA_MISMATCH');
    when others then
      -- What this mutation's data or the application's own SQL (triggers, checks, the functions
      -- they call) raised is this mutation's refusal; a fault of the server fails the request.
      get stacked diagnostics err_state = returned_sqlstate, err_message = message_text,
                              err_constraint = constraint_name;
      if kizuna.is_server_fault(err_state) or left(err_state, 2) = 'KZ' then
        raise;
      end if;
      return kizuna.rejected(m,
        case when left(err_state, 2) = '23' then 'CONSTRAINT_VIOLATION'
             when kizuna.is_type_mismatch(err_state) then 'SCHEMA_MISMATCH'
             else 'VALIDATION_FAILED' end,
        kizuna.refusal_message(err_state, err_message, err_constraint));
  end;
end
$$;

-- A write to a deleted key: DELETE_WINS when the client had a live copy the caller may see,
-- otherwise RLS_DENIED, so that a verdict never confirms a key the caller never saw.
create or replace function kizuna.tombstone_verdict(m jsonb, t kizuna.synced_tables, seen_images jsonb) returns jsonb
language plpgsql as $$
begin
  if exists (select 1 from kizuna.visible_images(t.rel, array(select jsonb_array_elements(coalesce(seen_images, '[]'))))) then
    return kizuna.rejected(m, 'DELETE_WINS');
  end if;
  return kizuna.rejected(m, 'RLS_DENIED');
end
$$;

-- The verdict of a mutation that reached the apply step, server_row rendered, with the bucket that
-- row is in: a client keeps the row only when it pulls that bucket (no pull of its would ever
-- bring or remove a row of another).
create or replace function kizuna.with_server_row(v jsonb, m jsonb) returns jsonb language plpgsql as $$
declare
  t kizuna.synced_tables;
  r jsonb;
  b text;
  key_type text;
  k text;
  err_context text;
begin
  if v ->> 'status' <> 'REJECTED' then
    return v;
  end if;
  select * into t from kizuna.synced_tables where name = m ->> 'table';
  if t.name is null then
    return v;
  end if;
  r := kizuna.render_row(t.rel, t.pk_column, m ->> 'pk');
  begin
    b := kizuna.bucket_of(t.rel, r);
  exception when undefined_column or datatype_mismatch then
    get stacked diagnostics err_context = pg_exception_context;
    perform kizuna.fail_if_raised_in_registration(t, err_context);
    raise;
  end;
  if b is not null then
    v := v || jsonb_build_object('bucket', b);
  end if;
  -- The key in its one spelling when the write named it in another (as for APPLIED), so the
  -- writer keeps the server's row under the key a pull brings it under: the key's text as the
  -- change log holds it (kizuna.key_text, and kizuna.stored_key where the column's equality is
  -- coarser than its text), not as the row renders it (a timestamp renders with a `T` in JSON and
  -- without one as text).
  key_type := kizuna.key_type_of(t);
  k := kizuna.stored_key(t.rel, t.pk_column, key_type, kizuna.key_text(key_type, m ->> 'pk'));
  if k is distinct from m ->> 'pk' and k is not null then
    v := v || jsonb_build_object('pk', k);
  end if;
  return jsonb_set(v, '{server_row}', coalesce(r, 'null'));
end
$$;

drop function if exists kizuna.precheck(jsonb, kizuna.clients);
drop function if exists kizuna.claim(jsonb, kizuna.clients);

-- Before anything applies: each mutation's verdict when it has one already (replay, SKIPPED,
-- DELAYED); null: to be applied. Nothing a mutation applies changes these answers (ids never
-- repeat within a request, and the client's row is locked), so deciding them first is deciding
-- them in order. The order is the order mutations are reached in: an atomic batch at its first
-- member (it names the first id recorded for another client, KZP01).
create or replace function kizuna.prechecks(muts jsonb, c kizuna.clients) returns jsonb[]
language plpgsql as $$
declare
  verdicts jsonb[];
  recorded constant jsonb[] := kizuna.recorded_verdicts(c.client_id, muts);
  b record;
  i integer;
begin
  select array_agg(case
           when recorded[o] is not null then recorded[o] || '{"replayed": true}'
           when (e ->> 'client_seq')::bigint <= c.pruned_seq
             then jsonb_build_object('id', e -> 'id', 'status', 'SKIPPED', 'replayed', false)
           when (e ->> 'apply_after')::timestamptz > now()
             then jsonb_build_object('id', e -> 'id', 'status', 'DELAYED', 'replayed', false)
         end order by o)
    into verdicts
    from jsonb_array_elements(muts) with ordinality a(e, o);

  -- One member of an atomic batch that may not apply yet: the batch waits as a whole, nothing stored.
  for b in select array_agg(o::integer order by o) as members from jsonb_array_elements(muts) with ordinality a(e, o)
            where e ->> 'batch' is not null group by e ->> 'batch'
           having bool_or(verdicts[o] ->> 'status' = 'DELAYED') loop
    foreach i in array b.members loop
      if verdicts[i] is null or verdicts[i] ->> 'status' = 'DELAYED' then
        verdicts[i] := jsonb_build_object('id', muts -> (i - 1) -> 'id', 'status', 'DELAYED', 'replayed', false);
      end if;
    end loop;
  end loop;
  return coalesce(verdicts, '{null}');
end
$$;

-- ---------------------------------------------------------------------------------------------
-- The entry point.

create or replace function public.kizuna_push(request jsonb) returns jsonb
language plpgsql set search_path = pg_catalog, public, pg_temp as $$
declare
  muts jsonb;
  n integer;
  c kizuna.clients;
  who text;
  verdicts jsonb[];
  runs jsonb;
  run jsonb;
  run_at integer[];
  positions integer[];
  out jsonb;
  t kizuna.synced_tables;
  i integer;
  k integer;
  v jsonb;
  m jsonb;
  batch_id text;
  batches text[];
  live integer[];
  failed integer;
  failed_verdict jsonb;
begin
  perform kizuna.check_push_request(request);
  who := kizuna.caller();
  c := kizuna.touch_client((request ->> 'client_id')::uuid, true);
  -- The fence stamps this device on the column versions the push writes (004_fence.sql).
  perform set_config('kizuna.client', c.client_id::text, true);
  muts := request -> 'mutations';
  n := jsonb_array_length(muts);
  verdicts := kizuna.prechecks(muts, c);
  -- Stretches of plain mutations are applied set-based (005_push_runs.sql); the rest one by one.
  runs := kizuna.plan_runs(muts, verdicts, c.client_id);
  run_at := array_fill(null::integer, array[greatest(n, 1)]);
  for k in 0 .. jsonb_array_length(runs) - 1 loop
    run_at[(runs -> k -> 'positions' ->> 0)::integer] := k;
  end loop;

  batches := array(select e ->> 'batch' from jsonb_array_elements(muts) with ordinality a(e, o) order by o);

  for i in 1 .. n loop
    batch_id := batches[i];

    if batch_id is null then
      continue when verdicts[i] is not null;
      if run_at[i] is not null then
        run := runs -> run_at[i];
        select * into t from kizuna.synced_tables where name = run ->> 'table';
        positions := array(select jsonb_array_elements_text(run -> 'positions')::integer);
        out := kizuna.apply_run(t, run ->> 'op', positions,
                                array(select jsonb_array_elements_text(run -> 'keys')), muts, c.client_id, who);
        for k in 1 .. cardinality(positions) loop
          verdicts[positions[k]] := out -> (k - 1);
        end loop;
      else
        m := muts -> (i - 1);
        verdicts[i] := kizuna.with_server_row(kizuna.apply_mutation(m, c.client_id, who), m);
      end if;
      continue;
    end if;

    -- An atomic batch: its members still to apply, in order, at the position of the first.
    live := array(select o::integer from jsonb_array_elements(muts) with ordinality a(e, o)
                   where e ->> 'batch' = batch_id order by o);
    continue when live[1] <> i;
    live := array(select u.x from unnest(live) u(x) where verdicts[u.x] is null);
    failed := null;
    begin
      foreach k in array live loop
        v := kizuna.apply_mutation(muts -> (k - 1), c.client_id, who);
        if v ->> 'status' = 'REJECTED' then
          failed := k;
          failed_verdict := v;
          raise exception 'batch member refused' using errcode = 'KZB01';
        end if;
        verdicts[k] := v;
      end loop;
    exception when sqlstate 'KZB01' then
      foreach k in array live loop
        verdicts[k] := case when k = failed then failed_verdict
                            else kizuna.rejected(muts -> (k - 1), 'BATCH_ABORTED') end;
      end loop;
    end;
    foreach k in array live loop
      verdicts[k] := kizuna.with_server_row(verdicts[k], muts -> (k - 1));
    end loop;
  end loop;

  return kizuna.finish_push(c.client_id, verdicts[1:n]);
end
$$;
