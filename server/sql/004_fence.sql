-- Kizuna SQL pack, file 4 of 10: the commit fence.
--
-- Every transaction that changes a synced table is numbered when it commits, and such
-- transactions commit one at a time:
--   1. the capture trigger (003) queues each row change in kizuna.pending and inserts the
--      transaction's row in kizuna.tx_marker;
--   2. that insert queues kizuna.fence(), a DEFERRABLE INITIALLY DEFERRED constraint trigger, so
--      it runs at COMMIT, after the transaction's own statements;
--   3. the fence takes one exclusive transaction-level advisory lock, draws the transaction's
--      number from kizuna.commit_seq and writes the change log. The lock is released only after the
--      commit is visible, so the next numbered transaction becomes visible after this one:
--      numbering order is visibility order, and the largest number a snapshot can see (the
--      horizon, the largest row of kizuna.commits) is never undercut by a later commit.
-- A push draws its number early with kizuna.fence_now() so that its verdicts can carry it; that
-- only starts holding the lock a little before commit. Plain SQL writes go through the same
-- triggers and are numbered the same way. NOTIFY kizuna_wake is delivered at commit, if any.

create or replace function kizuna.fence_lock_key() returns bigint language sql immutable as
  'select 7583421590113001';

-- The horizon: the largest commit number visible to the calling statement's snapshot.
create or replace function kizuna.horizon() returns bigint
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
begin
  return (select coalesce(max(seq), 0) from kizuna.commits);
end
$$;

-- The number a registration's backfill writes its change-log entries with (kizuna.register_table):
-- the fence gives them the transaction's commit number as it commits, so no committed entry
-- carries it.
create or replace function kizuna.unnumbered() returns bigint language sql immutable as 'select -1::bigint';

-- Takes the fence lock and returns this transaction's commit number, drawing it on first use.
-- The setting only says where to look: any session may set it, and one that set it to
-- `<its xid>:999999999999999999` had its writes numbered so, without the lock, and once the
-- reaper's low watermark passed that number every device's checkpoint expired, for good. The
-- number is this transaction's only when kizuna.commits holds it under this transaction's id.
create or replace function kizuna.fence_now() returns bigint
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  mine text := current_setting('kizuna.tx_seq', true);
  x xid8 := pg_current_xact_id();
  s bigint;
begin
  if mine ~ ('^' || x::text || ':[0-9]{1,18}$') then
    s := split_part(mine, ':', 2)::bigint;
    if exists (select 1 from kizuna.commits c where c.seq = s and c.xid = x) then
      return s;
    end if;
  end if;
  perform pg_advisory_xact_lock(kizuna.fence_lock_key());
  s := nextval('kizuna.commit_seq');
  perform set_config('kizuna.tx_seq', x::text || ':' || s, true);
  insert into kizuna.commits (seq, xid) values (s, x);
  perform pg_notify('kizuna_wake', json_build_object('horizon', s)::text);
  return s;
end
$$;

-- The commit-time trigger: numbers the transaction and folds its pending changes into the log.
create or replace function kizuna.fence() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  x xid8 := pg_current_xact_id();
  s bigint;
  pusher uuid;  -- one push, one device (kizuna_push)
begin
  if not exists (select 1 from kizuna.tx_marker where xid = x) then
    return null;  -- already folded by an earlier firing in this transaction
  end if;
  s := kizuna.fence_now();
  -- The device kizuna_push named, when it is the caller's: any session may set the setting, and
  -- one that named another user's device stamped its writes as that device's.
  select k.client_id into pusher from kizuna.clients k
   where k.client_id = nullif(current_setting('kizuna.client', true), '')::uuid and k.owner = kizuna.caller();

  -- Per key: the bucket it was in before the transaction (first event) and after it (last event).
  -- Live entry in the final bucket; tombstone, with the row image it left with, in the first one.
  -- One sort of the transaction's events and no join: the planner counts kizuna.pending as nearly
  -- empty (every commit empties it), and joined per key the events of a large transaction were
  -- compared pairwise while the fence lock held every other commit (a DELETE of 50,000 rows took
  -- 4.5 minutes to commit, of 4,000 rows 2 s). Both buckets by window, not aggregated: a commit of
  -- 50,000 inserts folds as fast as with the join (an array_agg per key cost it a fifth more).
  with ev as (
    select tbl, pk, id, old_bucket, image,
           first_value(old_bucket) over w as first_bucket, last_value(new_bucket) over w as last_bucket
      from kizuna.pending where xid = x
    window w as (partition by tbl, pk order by id rows between unbounded preceding and unbounded following)
  ), keyed as (
    -- The image the row left its first bucket with (an event with an image is a move or delete).
    select tbl, pk, min(first_bucket) as first_bucket, min(last_bucket) as last_bucket,
           (array_agg(image order by id) filter (where image is not null and old_bucket = first_bucket))[1] as image
      from ev group by tbl, pk
  ), entries as (
    select tbl, pk, last_bucket as bucket, false as deleted, null::jsonb as image
      from keyed where last_bucket is not null
    union all
    select tbl, pk, first_bucket, true, image
      from keyed where first_bucket is not null and first_bucket is distinct from last_bucket
  )
  insert into kizuna.changes as c (tbl, pk, bucket, seq, deleted, entered_seq, image, changed_at)
  select tbl, pk, bucket, s, deleted, case when deleted then null else s end, image, now() from entries
  on conflict (tbl, pk, bucket) do update
    set seq = excluded.seq, deleted = excluded.deleted, image = excluded.image, changed_at = excluded.changed_at,
        entered_seq = case when c.deleted and not excluded.deleted then excluded.seq else c.entered_seq end;

  -- Per-column versions (versioned tables): the last write of each column in this transaction.
  insert into kizuna.column_versions as v (tbl, pk, col, seq, hlc, writer, client)
  -- A write's clock as kizuna_push checked it (kizuna.hlc is any session's to set: one set to the
  -- year 2286 by plain SQL won every later write of those columns): a valid one no later than
  -- server time plus the allowed skew, else server time.
  select distinct on (p.tbl, p.pk, c.col) p.tbl, p.pk, c.col, s,
         case when kizuna.hlc_is_valid(p.hlc) then kizuna.hlc_clamp(p.hlc) else kizuna.hlc_now() end, p.writer, pusher
    from kizuna.pending p cross join lateral unnest(p.changed_cols) as c(col)
   where p.xid = x and p.changed_cols is not null
   order by p.tbl, p.pk, c.col, p.id desc
  on conflict (tbl, pk, col) do update set seq = excluded.seq, hlc = excluded.hlc, writer = excluded.writer,
                                           client = excluded.client;

  -- Tables this transaction migrated (every live entry announced again) or registered (the
  -- entries its backfill wrote, kizuna.unnumbered(); the fold above may have numbered one a later
  -- statement changed, but not when it entered its bucket): numbered now.
  if exists (select 1 from kizuna.announcing where xid = x) then
    update kizuna.changes c
       set seq = s, changed_at = now(),
           entered_seq = case when c.entered_seq = kizuna.unnumbered() then s else c.entered_seq end
      from kizuna.announcing a
     where a.xid = x and c.tbl = a.tbl
       and ((a.every_entry and not c.deleted) or c.seq = kizuna.unnumbered() or c.entered_seq = kizuna.unnumbered());
    delete from kizuna.announcing where xid = x;
  end if;

  -- Conflict-journal entries recorded by this transaction learn its number.
  update kizuna.conflicts set recorded_seq = s, winner_seq = coalesce(winner_seq, s)
   where xid = x and recorded_seq is null;

  delete from kizuna.pending where xid = x;
  delete from kizuna.tx_marker where xid = x;
  perform set_config('kizuna.marked', '', true);  -- a later write queues the fence again (003)
  return null;
end
$$;

do $$
begin
  if not exists (select 1 from pg_trigger where tgname = 'kizuna_fence' and tgrelid = 'kizuna.tx_marker'::regclass) then
    create constraint trigger kizuna_fence after insert on kizuna.tx_marker
      deferrable initially deferred for each row execute function kizuna.fence();
  end if;
  -- Capture fires in replica sessions (003_registry.sql), so its fence must too.
  perform kizuna.ensure_enabled_always('kizuna.tx_marker', 'kizuna_fence');
end
$$;
