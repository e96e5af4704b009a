-- Kizuna SQL pack, file 8 of 10: retention (the reaper), status, epochs and privileges.

-- Prunes what is past retention, durably (plain committed deletes and counters: a restart keeps
-- them). The tombstone part runs under the fence lock so the low watermark moves between two
-- commits, never across one; the ledger part runs before it takes that lock.
--   ledger entries older than ledger_retention; each client's pruned_seq rises to the highest
--     client_seq pruned, so a replay of a pruned mutation answers SKIPPED, never a second effect;
--   tombstones older than tombstone_retention; the low watermark rises to the highest pruned
--     tombstone's seq, and a run starting from a checkpoint below it gets CHECKPOINT_EXPIRED;
--   conflict-journal entries older than journal_retention;
--   commit numbers below the horizon (kizuna.commits keeps the newest only).
-- The optional arguments override the settings' retention for this one run (an operator reaping
-- now, a test forcing expiry); null keeps the setting.
drop function if exists kizuna.reap();
create or replace function kizuna.reap(tombstone_retention interval default null,
                                       ledger_retention interval default null) returns jsonb
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  cfg kizuna.settings;
  ledger_n bigint;
  tomb_n bigint;
  tomb_max bigint;
  journal_n bigint;
  lw bigint;
begin
  select * into cfg from kizuna.settings;
  cfg.tombstone_retention := coalesce(reap.tombstone_retention, cfg.tombstone_retention);
  cfg.ledger_retention := coalesce(reap.ledger_retention, cfg.ledger_retention);

  -- The ledger first, before the fence lock: a push locks its client row and then takes the fence
  -- lock, so a reaper holding the fence lock while it waits for client rows would deadlock with it.

  with gone as (
    delete from kizuna.ledger where created_at <= now() - cfg.ledger_retention and verdict is not null
    returning client_id, client_seq
  ), per_client as (
    select client_id, max(client_seq) as top, count(*) as n from gone group by client_id
  ), bumped as (
    update kizuna.clients c set pruned_seq = greatest(c.pruned_seq, p.top)
      from per_client p where c.client_id = p.client_id
    returning p.n
  )
  select coalesce(sum(n), 0) into ledger_n from bumped;

  perform pg_advisory_xact_lock(kizuna.fence_lock_key());

  with gone as (
    delete from kizuna.changes where deleted and changed_at <= now() - cfg.tombstone_retention
    returning seq
  )
  select count(*), max(seq) into tomb_n, tomb_max from gone;

  -- Entries that never got a number (their row was in no bucket, so no commit delivered them) age
  -- out the same way.
  delete from kizuna.conflicts where created_at <= now() - cfg.journal_retention;
  get diagnostics journal_n = row_count;

  -- Only the newest commit number is needed for the horizon.
  delete from kizuna.commits where seq < (select max(seq) from kizuna.commits);

  update kizuna.state
     set low_watermark = greatest(low_watermark, coalesce(tomb_max, 0)),
         ledger_pruned_total = ledger_pruned_total + ledger_n,
         tombstones_pruned_total = tombstones_pruned_total + tomb_n,
         last_reap_at = now()
  returning low_watermark into lw;

  return jsonb_build_object('ledger_pruned', ledger_n, 'tombstones_pruned', tomb_n,
                            'conflicts_pruned', journal_n, 'low_watermark', lw);
end
$$;

-- Durable figures, for `kizuna-server status` and /metrics.
create or replace function kizuna.status() returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select jsonb_build_object(
    'epoch', s.epoch,
    'horizon', kizuna.horizon(),
    'low_watermark', s.low_watermark,
    'ledger_size', (select count(*) from kizuna.ledger),
    'tombstones', (select count(*) from kizuna.changes where deleted),
    'change_log_size', (select count(*) from kizuna.changes),
    'clients', (select count(*) from kizuna.clients),
    'synced_tables', (select count(*) from kizuna.synced_tables),
    'conflicts', (select count(*) from kizuna.conflicts),
    'applied_total', s.applied_total,
    'replayed_total', s.replayed_total,
    'skipped_total', s.skipped_total,
    'delayed_total', s.delayed_total,
    'rejected_total', s.rejected_total,
    'ledger_pruned_total', s.ledger_pruned_total,
    'tombstones_pruned_total', s.tombstones_pruned_total,
    'last_reap_at', s.last_reap_at,
    'installed_at', s.installed_at)
  from kizuna.state s
$$;

-- Starts a new server history: every cursor issued so far answers SERVER_RESET and clients
-- rehydrate. For operators after restoring a backup in place (a restore into another database or
-- cluster is detected at install by itself).
create or replace function kizuna.new_epoch() returns text
language sql security definer set search_path = pg_catalog, pg_temp as $$
  update kizuna.state set epoch = substr(replace(gen_random_uuid()::text, '-', ''), 1, 16) returning epoch
$$;

-- Privileges: the API roles call the two entry points, which need the helpers; the admin
-- functions (registry, reaper, status, epochs, fence) stay with the owner.
revoke all on all functions in schema kizuna from public;
grant execute on all functions in schema kizuna to anon, authenticated, service_role;
revoke execute on function
  kizuna.register_table(regclass, text, text, integer, boolean, regprocedure, name, text),
  kizuna.unregister_table(regclass),
  kizuna.ensure_column(regclass, name, text),
  kizuna.ensure_index(text, text),
  kizuna.ensure_enabled_always(regclass, name),
  kizuna.compile_table(text),
  kizuna.analyse_bucket(kizuna.synced_tables),
  kizuna.enter_rows(text),
  kizuna.take_up_shape(text),
  kizuna.number_at_commit(text, boolean),
  kizuna.follow_migration(),
  kizuna.ensure_event_trigger(text, text, text[], text),
  kizuna.drop_deleted_indexes(regclass, text),
  kizuna.reap(interval, interval),
  kizuna.status(),
  kizuna.new_epoch(),
  kizuna.fence(),
  kizuna.fence_now()
from anon, authenticated, service_role;
-- A pull page must read one snapshot (006): PostgREST (12 and later) starts an RPC's transaction at
-- the isolation level its function names here; the bundled gateway sets it itself.
alter function public.kizuna_pull(jsonb) set default_transaction_isolation = 'repeatable read';
revoke all on function public.kizuna_push(jsonb), public.kizuna_pull(jsonb) from public;
grant execute on function public.kizuna_push(jsonb), public.kizuna_pull(jsonb) to anon, authenticated, service_role;
