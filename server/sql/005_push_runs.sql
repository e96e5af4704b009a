-- Kizuna SQL pack, file 6 of 10: push, set-based runs.
--
-- kizuna_push (005_push.sql) applies consecutive plain mutations of a slice as one run: one
-- INSERT ... ON CONFLICT, UPDATE or DELETE for all of them, instead of one savepoint and several
-- statements per mutation. A run gives exactly the verdicts and effects the per-mutation path
-- (kizuna.apply_mutation) would give them one after another, because it is only used where the
-- two cannot differ:
--   - the mutations are consecutive in the slice (what sits between them has no effect: replays,
--     SKIPPED, DELAYED, members of an atomic batch applied earlier), lone (not in a batch), of one
--     table, one op and one set of named columns, and name distinct keys;
--   - each would pass the per-mutation path's own checks (a synced table, a key of the key
--     column's type, writable columns, a key that is not deleted), so the only way left for one
--     to be refused is an error raised while writing, or its gate, or no row affected;
--   - nothing that runs per row can tell one statement from several (kizuna.run_ops): the table
--     is in arrival mode without journal; its policies, checks, defaults and its bucket expression
--     read no rows and call only immutable functions (or auth.uid/jwt/role; the app's own, as
--     pg_depend records no built-in one), and the bucket's text
--     follows no setting of the session (kizuna.tree_follows_settings); its gate is immutable;
--     no deferrable constraint; no AFTER or statement trigger of the app's (foreign keys to other
--     tables are checked at the statement's end, against rows a run does not write); BEFORE ROW
--     triggers only for upserts, which a run feeds in the slice's order (a BEFORE ROW trigger sees
--     the rows the same statement wrote before, as in separate statements); for patches, whose
--     join order is the planner's, no trigger and no unique index but the primary key.
-- A run statement that fails for any reason but a server fault (a policy's WITH CHECK, a
-- constraint, a trigger's RAISE, a value that does not fit, a gate that says no) is rolled back
-- and the run is split in two halves, each tried again in order; four mutations or fewer take the
-- per-mutation path. So a refused mutation gets the per-mutation path's verdict, and the others
-- are applied as if it had not been there, as before.

-- Whether what a table evaluates per row reads no rows: its policies hold no subquery over a table
-- (a range table entry in the stored expression; `(select auth.uid())` has none), and they, its
-- checks, column defaults and generated columns, and the checks of its columns' domains refer to no
-- other relation (sequences aside) and call only pure functions.
create or replace function kizuna.row_rules_pure(rel regclass) returns boolean language plpgsql stable as $$
begin
  return not exists (select 1 from pg_policy p where p.polrelid = rel
                        and (coalesce(p.polqual::text, '') || coalesce(p.polwithcheck::text, '')) like '%{RANGETBLENTRY%')
    and not exists (
    with objects as (
      select 'pg_policy'::regclass as cls, p.oid from pg_policy p where p.polrelid = rel
      union all
      select 'pg_constraint'::regclass, k.oid from pg_constraint k where k.conrelid = rel and k.contype = 'c'
      union all
      select 'pg_attrdef'::regclass, d.oid from pg_attrdef d where d.adrelid = rel
      union all
      select 'pg_constraint'::regclass, k.oid
        from pg_attribute a join pg_type ty on ty.oid = a.atttypid and ty.typtype = 'd'
        join pg_constraint k on k.contypid = ty.oid
       where a.attrelid = rel and a.attnum > 0 and not a.attisdropped
    )
    select 1 from objects o join pg_depend d on d.classid = o.cls and d.objid = o.oid
     where case d.refclassid
       -- a column of the table, or the policy's own table; sequences
       when 'pg_class'::regclass then
         not (d.refobjid = rel and (d.refobjsubid > 0 or (o.cls = 'pg_policy'::regclass and d.deptype = 'a')))
         and not exists (select 1 from pg_class s where s.oid = d.refobjid and s.relkind = 'S')
       when 'pg_proc'::regclass then not kizuna.is_pure_function(d.refobjid)
       when 'pg_operator'::regclass then
         not kizuna.is_pure_function((select op.oprcode from pg_operator op where op.oid = d.refobjid))
       else false end);
end
$$;

-- What kizuna.plan_runs works out from the catalogs about a table (kizuna.run_facts) is kept for
-- the session, under the catalog epoch: a number that every DDL command in this database advances
-- (an event trigger at ddl_command_end). Worked out afresh at every push, the catalog queries cost
-- more than a whole slice's INSERT. An answer is kept only when no transaction that changed the
-- catalogs is still open: such a transaction holds kizuna.catalog_lock() shared from its first
-- DDL command to its end (nothing takes it exclusively, so it never waits), so an answer worked
-- out from catalogs that it is about to change is never kept under the epoch it has already drawn. Without the event trigger (creating one needs a
-- superuser) nothing is kept, and every push works its facts out afresh, as before.
create sequence if not exists kizuna.catalog_epoch;

create or replace function kizuna.catalog_lock() returns bigint language sql immutable as
  'select 7583421590113002';

create or replace function kizuna.advance_catalog_epoch() returns event_trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  perform pg_advisory_xact_lock_shared(kizuna.catalog_lock());
  perform nextval('kizuna.catalog_epoch');
end
$$;

select kizuna.ensure_event_trigger('kizuna_catalog_epoch', 'kizuna.advance_catalog_epoch', null,
  'kizuna: the catalog epoch needs an event trigger, which needs a superuser: every push works out its tables'' facts afresh');

-- The catalog epoch, or null when an answer may not be kept now: no event trigger advances it, or
-- a transaction that changed the catalogs is still open. The epoch is read first: a DDL
-- transaction that drew it took the lock before, and holds it until its changes are visible to
-- every new snapshot, so either the lock is still listed or the catalogs read after this show what
-- it changed. One that draws a new epoch after the read makes what is kept under this one stale.
-- The lock is looked up in pg_locks rather than taken: a session-level lock that a cancel left
-- held would have stopped every DDL command of the database.
create or replace function kizuna.settled_catalog_epoch() returns bigint
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  epoch bigint;
begin
  if not exists (select 1 from pg_event_trigger where evtname = 'kizuna_catalog_epoch' and evtenabled = 'A') then
    return null;
  end if;
  select last_value into epoch from kizuna.catalog_epoch;
  if exists (select 1 from pg_locks l
              where l.locktype = 'advisory' and l.objsubid = 1
                and l.database = (select d.oid from pg_database d where d.datname = current_database())
                and l.classid = (kizuna.catalog_lock() >> 32)::oid
                and l.objid = (kizuna.catalog_lock() & 4294967295)::oid) then
    return null;
  end if;
  return epoch;
end
$$;

-- What kizuna.plan_runs needs to know of a table: `ops` (kizuna.run_ops), `key_type` and
-- `writable` (its key column's type and its writable columns). Kept for the session under the
-- catalog epoch and the table's registry row.
create or replace function kizuna.run_facts(t kizuna.synced_tables) returns jsonb language plpgsql as $$
declare
  setting constant text := 'kizuna.run_facts_' || t.rel::oid;
  epoch constant bigint := kizuna.settled_catalog_epoch();
  kept_as constant text := epoch || ':' || md5(t::text) || ' ';
  kept constant text := current_setting(setting, true);
  facts jsonb;
begin
  if epoch is not null and starts_with(kept, kept_as) then
    return substr(kept, length(kept_as) + 1)::jsonb;
  end if;
  facts := jsonb_build_object('ops', to_jsonb(kizuna.run_ops(t)), 'key_type', kizuna.column_type(t.rel, t.pk_column),
                              'writable', kizuna.writable_columns(t.rel));
  if epoch is not null then
    perform set_config(setting, kept_as || facts::text, false);
  end if;
  return facts;
end
$$;

-- The ops a table's mutations may be applied in runs (see above); empty: none.
create or replace function kizuna.run_ops(t kizuna.synced_tables) returns text[] language plpgsql stable as $$
begin
  return (with triggers as (
    select g.tgtype, g.tgisinternal, g.tgdeferrable, k.contype, k.conrelid, k.confrelid, k.confkey
      from pg_trigger g left join pg_constraint k on k.oid = g.tgconstraint
     where g.tgrelid = t.rel
       and not (g.tgname = 'kizuna_capture' and g.tgfoid = (select p.oid from pg_proc p
                  where p.pronamespace = 'kizuna'::regnamespace and p.proname = 'capture_' || t.rel::oid and p.pronargs = 0))
  )
  select coalesce(array_agg(o.op order by o.op), '{}')
    from (values ('upsert', 4 | 16), ('patch', 16), ('delete', 8)) o(op, events)
   where t.conflict_mode = 'arrival' and not t.journal
     -- A key whose equality is coarser than its text is spelled as its row spells it
     -- (kizuna.stored_key), which a run's earlier write of the same key may have just decided.
     and kizuna.key_is_exact(t.rel, t.pk_column)
     and t.bucket_functions is not null
     and not exists (select 1 from unnest(t.bucket_functions) f where not kizuna.is_pure_function(f))
     -- A run writes each row's bucket into its verdict as the session renders it; the change log
     -- holds it as rendered under fixed settings (kizuna.compile_table).
     and t.bucket_follows_settings is false
     and (t.gate is null or kizuna.is_pure_function(t.gate))
     and exists (select 1 from pg_class c where c.oid = t.rel and c.relkind = 'r' and not c.relhasrules
                    and not c.relhassubclass and not c.relispartition)
     and not exists (select 1 from pg_constraint k where k.conrelid = t.rel and k.condeferrable)
     and kizuna.row_rules_pure(t.rel)
     and not exists (
       select 1 from triggers g where g.tgtype & o.events <> 0 and not (
         -- a foreign key of this table's to another table
         (g.tgisinternal and not g.tgdeferrable and g.contype = 'f' and g.conrelid = t.rel and g.confrelid <> t.rel
          and not exists (select 1 from triggers u where not u.tgisinternal and u.tgtype & o.events <> 0))
         -- another table's foreign key to this table's primary key, which no push changes
         or (g.tgisinternal and not g.tgdeferrable and g.contype = 'f' and g.confrelid = t.rel and g.conrelid <> t.rel
             and o.op <> 'delete'
             and g.confkey = (select array[a.attnum] from pg_attribute a where a.attrelid = t.rel and a.attname = t.pk_column))
         -- the app's BEFORE ROW triggers, for upserts
         or (not g.tgisinternal and o.op = 'upsert' and g.tgtype & (1 | 2 | 64) = (1 | 2)
             and not exists (select 1 from triggers f where f.tgisinternal and f.conrelid = t.rel and f.tgtype & o.events <> 0))))
     and (o.op <> 'patch' or not exists (select 1 from pg_index x where x.indrelid = t.rel
                                           and (x.indisunique or x.indisexclusion) and not x.indisprimary)));
end
$$;

-- Which of these keys of a table are deleted for push (tombstones and no live entry): the same
-- answer kizuna.key_state gives one key at a time, for the caller's own client.
create or replace function kizuna.deleted_keys(table_name text, keys text[], client uuid) returns text[]
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
begin
  perform kizuna.check_own_client(client);
  -- One index lookup per key, whatever the statistics say. As `c.pk = any (keys)`, a plan made
  -- while the statistics still counted few rows of the table read all of them for every push
  -- (a push of 256 writes took 33 ms longer for every 10,000 rows pushed before it).
  return array(select k from unnest(keys) k
                where (select bool_and(c.deleted) from kizuna.changes c where c.tbl = table_name and c.pk = k));
end
$$;

-- The runs of a slice: [{"table", "op", "positions": [1-based, in order], "keys": [canonical]}].
-- `verdicts` holds what is decided before anything applies (replays, SKIPPED, DELAYED, ids a
-- concurrent duplicate claimed); a position it leaves null is applied, in a run or alone.
create or replace function kizuna.plan_runs(muts jsonb, verdicts jsonb[], client uuid) returns jsonb
language plpgsql as $$
declare
  n integer := jsonb_array_length(muts);
  e_table text[] := array_fill(null::text, array[greatest(n, 1)]);  -- null: not in a run
  e_op text[] := array_fill(null::text, array[greatest(n, 1)]);
  e_key text[] := array_fill(null::text, array[greatest(n, 1)]);
  e_cols text[] := array_fill(null::text, array[greatest(n, 1)]);
  e_prev integer[] := array_fill(null::integer, array[greatest(n, 1)]);  -- the position before with the same key
  batch_at boolean[] := array_fill(false, array[greatest(n, 1)]);  -- an atomic batch applies here
  t kizuna.synced_tables;
  facts jsonb;
  ops text[];
  key_type text;
  writable jsonb;
  positions integer[];
  raw text[];
  keys text[];
  deleted text[];
  r record;
  runs jsonb := '[]';
  run_table text;
  run_op text;
  run_cols text;
  run_positions integer[] := '{}';
  i integer;
  j integer;
begin
  -- Where an atomic batch with members still to apply takes effect: at its first member.
  for i in select min(o) from jsonb_array_elements(muts) with ordinality a(e, o)
            where e ->> 'batch' is not null group by e ->> 'batch'
           having bool_or(verdicts[o] is null) loop
    batch_at[i] := true;
  end loop;

  -- Per table: which lone mutations still to apply could go in a run.
  for t in select s.* from kizuna.synced_tables s
            where s.name in (select e ->> 'table' from jsonb_array_elements(muts) with ordinality a(e, o)
                              where verdicts[o] is null and e ->> 'batch' is null) loop
    facts := kizuna.run_facts(t);
    ops := array(select jsonb_array_elements_text(facts -> 'ops'));
    continue when cardinality(ops) = 0;
    select array_agg(o::integer order by o), array_agg(e ->> 'pk' order by o) into positions, raw
      from jsonb_array_elements(muts) with ordinality a(e, o)
     where verdicts[o] is null and e ->> 'batch' is null and e ->> 'table' = t.name and e ->> 'op' = any (ops);
    continue when positions is null;
    -- One spelling per key (kizuna.key_text), all at once where every key casts; null where one does not.
    key_type := facts ->> 'key_type';
    keys := raw;
    if key_type <> 'text' then
      begin
        execute format('select array_agg(%s order by o) from unnest($1) with ordinality u(k, o)',
                       kizuna.spell_key_sql(key_type, format('cast(k as %s)', key_type)))
          into keys using raw;
      exception when others then
        if kizuna.is_server_fault(sqlstate) then
          raise;
        end if;
        for j in 1 .. cardinality(raw) loop
          keys[j] := kizuna.key_text(key_type, raw[j]);
        end loop;
      end;
    end if;
    deleted := kizuna.deleted_keys(t.name, keys, client);
    writable := facts -> 'writable';
    -- What the per-mutation path would refuse before writing goes alone (it gives the verdict).
    for r in
      select u.pos, m.e ->> 'op' as op, u.key, k.cols, lag(u.pos) over (partition by u.key order by u.pos) as prev
        from unnest(positions, keys) u(pos, key)
        cross join lateral (select muts -> (u.pos - 1) as e, coalesce(nullif(muts -> (u.pos - 1) -> 'columns', 'null'), '{}') as c) m
        cross join lateral (
          -- The columns a row names besides its key (jsonb keeps an object's keys in one order);
          -- the key column is always written, named or not.
          select coalesce(string_agg(x, ',') filter (where x <> t.pk_column), '') as cols,
                 coalesce(bool_and(writable ? x), true) as writable
            from jsonb_object_keys(m.c) x) k
       where u.key is not null and not u.key = any (deleted)
         and (m.e ->> 'op' = 'delete'
              or (k.writable and not (m.c ? t.pk_column and m.c ->> t.pk_column is distinct from u.key)))
    loop
      e_table[r.pos] := t.name;
      e_op[r.pos] := r.op;
      e_key[r.pos] := r.key;
      e_cols[r.pos] := case when r.op <> 'delete' then r.cols end;
      e_prev[r.pos] := r.prev;
    end loop;
  end loop;

  -- Runs: maximal stretches of such mutations with the same table, op and columns and distinct
  -- keys. A mutation applied on its own, or an atomic batch, ends the stretch; what has no effect
  -- (a decided mutation, a member of a batch applied at its first member) does not.
  for i in 1 .. n + 1 loop
    if i <= n and not batch_at[i] and (verdicts[i] is not null or muts -> (i - 1) ->> 'batch' is not null) then
      continue;  -- no effect here
    end if;
    -- (Every candidate since the run's first position is in the run, so a key repeats in it when
    -- its candidate before, of this table, is at or after that position.)
    if i <= n and e_table[i] = run_table and e_op[i] = run_op and e_cols[i] is not distinct from run_cols
       and not coalesce(e_prev[i] >= run_positions[1], false) then
      run_positions := run_positions || i;
      continue;
    end if;
    -- The stretch ends here.
    if cardinality(run_positions) > 0 then
      runs := runs || jsonb_build_array(jsonb_build_object('table', run_table, 'op', run_op,
                                                           'positions', to_jsonb(run_positions),
                                                           'keys', to_jsonb(array(select e_key[p.x] from unnest(run_positions) with ordinality p(x, o) order by p.o))));
    end if;
    run_positions := '{}';
    run_table := null;
    if i <= n and e_table[i] is not null then
      run_table := e_table[i];
      run_op := e_op[i];
      run_cols := e_cols[i];
      run_positions := array[i];
    end if;
  end loop;
  return runs;
end
$$;

-- Applies one run (positions and canonical keys as kizuna.plan_runs gave them) and returns its
-- verdicts in the order of `positions` (server_row rendered). The statement and the gate run in
-- one savepoint; when either refuses, the run is split (see the top of this file).
create or replace function kizuna.apply_run(t kizuna.synced_tables, op text, positions integer[], keys text[],
                                            muts jsonb, client uuid, who text) returns jsonb
language plpgsql as $$
declare
  n integer := cardinality(positions);
  rows_ jsonb[];
  cols text[];
  assign text[];
  written text;
  done jsonb;
  done_count bigint;
  refused bigint;
  verdicts jsonb := '[]';
  unwritten integer[];
  m jsonb;
  j integer;
  half integer;
  err_state text;
begin
  if op <> 'delete' then
    -- Each row as the per-mutation path writes it: the named columns and the canonical key.
    rows_ := array(select coalesce(nullif(muts -> (positions[g.x] - 1) -> 'columns', 'null'), '{}') || jsonb_build_object(t.pk_column, keys[g.x])
                     from generate_subscripts(positions, 1) g(x) order by g.x);
    cols := array(select k from jsonb_object_keys(rows_[1]) k order by k);
    assign := array(select c from unnest(cols) c where c <> t.pk_column);
  end if;
  -- One statement writes the run and returns the rows written, as an object from each one's key to
  -- its bucket (the registry's expression over the row written), and how many the gate refuses.
  written := case op
    when 'upsert' then format($q$
      insert into %1$s as t (%2$s)
      select %3$s from unnest($1) with ordinality as kz_u(kz_c, kz_o)
             cross join lateral jsonb_populate_record(null::%1$s, kz_u.kz_c) as kz_r
       order by kz_u.kz_o  -- the slice's order: a BEFORE ROW trigger sees the rows written before it, as it would
      on conflict (%4$I) do update set %5$s
      returning t.*$q$,
      t.rel,
      (select string_agg(format('%I', c), ', ') from unnest(cols) c),
      (select string_agg(format('kz_r.%I', c), ', ') from unnest(cols) c),
      t.pk_column,
      coalesce((select string_agg(format('%1$I = excluded.%1$I', c), ', ') from unnest(assign) c),
               format('%1$I = excluded.%1$I', t.pk_column)))
    when 'patch' then format($q$
      update %1$s as t set %2$s
        from unnest($1) as kz_u(kz_c) cross join lateral jsonb_populate_record(null::%1$s, kz_u.kz_c) as kz_r
       where t.%3$I = kz_r.%3$I
      returning t.*$q$,
      t.rel,
      coalesce((select string_agg(format('%1$I = kz_r.%1$I', c), ', ') from unnest(assign) c),
               format('%1$I = t.%1$I', t.pk_column)),
      t.pk_column)
    else format($q$
      delete from %1$s as t where t.%2$I = any (array(select cast(k as %3$s) from unnest($2) k))
      returning t.*$q$,
      t.rel, t.pk_column, kizuna.column_type(t.rel, t.pk_column))
  end;

  begin
    -- As the per-mutation path leaves it for an arrival-mode table (the capture trigger reads it).
    perform set_config('kizuna.hlc', '', true);
    execute format('with w as (%s) select jsonb_object_agg(%s, %s), count(*), count(*) filter (where %s) from w',
                   written, kizuna.spell_column_sql(t.rel, t.pk_column, 'w'),
                   case when op = 'delete' then 'null::text' else '(' || t.bucket_expr || ')::text' end,
                   coalesce((select format('%I.%I($3, to_jsonb(w)) is not true', ns.nspname, p.proname)
                               from pg_proc p join pg_namespace ns on ns.oid = p.pronamespace where p.oid = t.gate), 'false'))
      into done, done_count, refused using rows_, keys, op;
    done := coalesce(done, '{}');
    if refused > 0 then
      raise exception 'the gate refused % rows of the run', refused using errcode = 'KZR01';
    end if;
    if op = 'upsert' and done_count <> n then
      raise exception 'a run upsert wrote % of % rows', done_count, n using errcode = 'KZR01';
    end if;
    -- A delete that committed while the statement waited for a row it removed: the upsert created
    -- the key again (see kizuna.apply_mutation). The keys were live or new when planned; one
    -- deleted now sends the run to be split, and its write to the per-mutation path's verdict.
    if op = 'upsert' and not kizuna.is_universe_source() and cardinality(kizuna.deleted_keys(t.name, keys, client)) > 0 then
      raise exception 'a key of the run was deleted while it waited' using errcode = 'KZR01';
    end if;
  exception when others then
    get stacked diagnostics err_state = returned_sqlstate;
    -- KZV01 is a gate refusing by raising (003_registry.sql): a refusal of one row, found one by one.
    if err_state not in ('KZR01', 'KZV01') and (kizuna.is_server_fault(err_state) or left(err_state, 2) = 'KZ') then
      raise;
    end if;
    -- Rolled back: split, or apply one by one.
    if n > 4 then
      half := n / 2;
      return kizuna.apply_run(t, op, positions[1:half], keys[1:half], muts, client, who)
          || kizuna.apply_run(t, op, positions[half + 1:n], keys[half + 1:n], muts, client, who);
    end if;
    for j in 1 .. n loop
      m := muts -> (positions[j] - 1);
      verdicts := verdicts || jsonb_build_array(kizuna.with_server_row(kizuna.apply_mutation(m, client, who), m));
    end loop;
    return verdicts;
  end;

  -- Each mutation's row is found by its key in `done`, in one pass over the run.
  select jsonb_agg(case when done ? u.k then jsonb_strip_nulls(jsonb_build_object(
           'id', muts -> (u.p - 1) -> 'id', 'status', 'APPLIED', 'replayed', false, 'bucket', done -> u.k,
           'pk', nullif(u.k, muts -> (u.p - 1) ->> 'pk'),
           '_fresh', true, '_seq', muts -> (u.p - 1) -> 'client_seq')) end order by u.x),
         array_agg(u.x) filter (where not done ? u.k)
    into verdicts, unwritten
    from unnest(positions, keys) with ordinality u(p, k, x);
  foreach j in array coalesce(unwritten, '{}') loop
    -- No row affected (patch, delete): absent, or the caller's policy hides or protects it.
    m := muts -> (positions[j] - 1);
    verdicts := jsonb_set(verdicts, array[(j - 1)::text], kizuna.with_server_row(kizuna.rejected(m, 'RLS_DENIED'), m));
  end loop;
  return verdicts;
end
$$;
