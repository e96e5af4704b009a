-- Kizuna SQL pack, file 3 of 10: the registry of synced tables.
--
-- kizuna.register_table(...) records a table and compiles two functions for it:
--   kizuna."bucket_<oid>"(row)  the admin's bucket expression over the row's columns, and
--   kizuna."capture_<oid>"()    the AFTER ROW trigger that queues each change for the commit fence.
-- Compiling (rather than evaluating the expression dynamically per row) keeps the trigger cheap.
-- Admin only: EXECUTE is revoked from the API roles (see 007_admin.sql).

-- Bump when the capture template changes: installs recompile every registered table once.
create or replace function kizuna.compile_version() returns integer language sql immutable as 'select 13';

-- Drops the indexes of table `rel`'s deleted keys (kizuna.deleted_index names them), but `keep`.
-- Called by compile_table and unregister_table (admin only, as they are).
create or replace function kizuna.drop_deleted_indexes(rel regclass, keep text default null) returns void
language plpgsql set search_path = pg_catalog, pg_temp as $$
declare
  stale text;
begin
  for stale in select i.indexname from pg_indexes i
                where i.schemaname = 'kizuna' and i.indexname like 'changes\_deleted\_' || rel::oid::text || '\_%'
                  and i.indexname is distinct from keep loop
    execute format('drop index kizuna.%I', stale);
  end loop;
end
$$;

-- `kizuna.registering` is on while it runs: the ALTER TABLE it issues is not a migration for
-- kizuna.follow_migration to take up.
create or replace function kizuna.compile_table(table_name text) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp set kizuna.registering = 'on' as $$
declare
  t kizuna.synced_tables;
  oid_ text;
  versioned boolean;
  cols_expr text;
  deleted_index text;
  settings text;
begin
  select * into strict t from kizuna.synced_tables where name = table_name;
  oid_ := t.rel::oid::text;
  versioned := t.conflict_mode = 'hlc' or t.journal;
  perform kizuna.analyse_bucket(t);
  -- An expression that renders a date or time as text (`'day:' || to_char(at, 'YYYY-MM-DD')`)
  -- runs under fixed settings: run as written, it put a row written by a session in Asia/Tokyo in
  -- another bucket than the same row written by the gateway. About 3.5 µs a row written, so only
  -- where the expression may follow them.
  settings := case when (select s.bucket_follows_settings from kizuna.synced_tables s where s.name = t.name)
                   then kizuna.fixed_settings() else '' end;

  -- The bucket of a row: the admin's expression with the row's columns in scope; null = no bucket.
  execute format($f$
    create or replace function kizuna.%I(kz_row %s) returns text
    language sql stable set search_path = pg_catalog, public, pg_temp %s as
    'select (%s)::text from (select (kz_row).*) as kz_cols'
  $f$, 'bucket_' || oid_, t.rel, settings, replace(t.bucket_expr, '''', ''''''));

  -- The capture trigger's reading of a row: its bucket and its key as text, in one call. Read as
  -- `new.<key>` in PL/pgSQL, the key's type was kept in the trigger's cached plans: once a
  -- migration changed it (integer to bigint), every later write to the table failed in every
  -- session that wrote to it before (each of the gateway's pooled connections), its pushes refused
  -- as SCHEMA_MISMATCH. A SQL function with a SET clause is never inlined: it reads the row's type
  -- afresh at each statement. The key as a column of `kz_cols`: as `(kz_row).<key>`, a column
  -- named `kz_row` was read in the row's place. One call for both: a second one cost about 3 µs
  -- more per row written (50,000-row INSERTs, the trigger's reading alone: 3 µs a row in one call,
  -- 4 µs for the bucket call and `new.<key>` before, 7 µs in two calls). The key spelled by no
  -- session's settings (kizuna.spell_key_sql), as a push spells it.
  execute format($f$
    create or replace function kizuna.%I(kz_row %s) returns text[]
    language sql stable set search_path = pg_catalog, public, pg_temp %s as %L
  $f$, 'place_' || oid_, t.rel, settings,
       format('select array[(%s)::text, %s] from (select (kz_row).*) as kz_cols', t.bucket_expr,
              kizuna.spell_column_sql(t.rel, t.pk_column, 'kz_cols')));

  -- Which columns a write assigned (versioned tables keep per-column versions): what a push
  -- names (kizuna.insert_cols / kizuna.update_cols, set by push, '' outside it); for plain SQL,
  -- the non-null columns of an INSERT and the changed columns of an UPDATE. (An array() over no
  -- setting is empty, not null, so the setting itself decides which applies.)
  cols_expr := case when not versioned then 'null'
    else $c$case tg_op
      when 'INSERT' then case when coalesce(current_setting('kizuna.insert_cols', true), '') = ''
        then array(select n.key from jsonb_each(to_jsonb(new)) n where n.value <> 'null')
        else array(select jsonb_array_elements_text(current_setting('kizuna.insert_cols', true)::jsonb)) end
      when 'UPDATE' then case when coalesce(current_setting('kizuna.update_cols', true), '') = ''
        then array(select n.key from jsonb_each(to_jsonb(new)) n join jsonb_each(to_jsonb(old)) o using (key)
                    where n.value is distinct from o.value)
        else array(select jsonb_array_elements_text(current_setting('kizuna.update_cols', true)::jsonb)) end
    end$c$ end;

  execute format($f$
    create or replace function kizuna.%1$I() returns trigger
    language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $cap$
    declare
      x xid8 := pg_current_xact_id();
      ob text; nb text; opk text; npk text; cols text[]; place text[];
      who text := kizuna.caller();  -- the same name a push records for its caller
      h text := nullif(current_setting('kizuna.hlc', true), '');
    begin
      if tg_op <> 'INSERT' then place := kizuna.%2$I(old); ob := place[1]; opk := place[2]; end if;
      if tg_op <> 'DELETE' then place := kizuna.%2$I(new); nb := place[1]; npk := place[2]; end if;
      if ob is null and nb is null then
        return null;  -- in no bucket before or after: nothing to sync
      end if;
      -- The change log indexes a key with its bucket, and a btree entry holds at most 2,704 bytes:
      -- past that the transaction failed at commit, after every check had passed (a push as a
      -- fault of the server, resent for ever, with PostgreSQL's words naming the pack's index).
      -- Refused here, in the write's own statement: a push's refusal of that one write.
      -- Only a new key or bucket: one the row had is in the index already, so a row stored
      -- before this check (a key that compressed well) can still be written and deleted.
      if (npk is distinct from opk or nb is distinct from ob)
         and octet_length(coalesce(npk, '')) + octet_length(coalesce(nb, '')) > 2400 then
        raise exception 'a synced row''s key and bucket must stay under 2,400 bytes together'
          using errcode = '54000';
      end if;
      cols := %4$s;
      if tg_op = 'UPDATE' and opk is distinct from npk then
        -- A key change is a delete of the old key and an insert of the new one.
        insert into kizuna.pending (xid, tbl, pk, old_bucket, new_bucket, image, changed_cols, hlc, writer)
        values (x, %3$L, opk, ob, null, case when ob is not null then to_jsonb(old) end, null, h, who),
               (x, %3$L, npk, null, nb, null, cols, h, who);
      else
        insert into kizuna.pending (xid, tbl, pk, old_bucket, new_bucket, image, changed_cols, hlc, writer)
        values (x, %3$L, coalesce(npk, opk), ob, nb,
                case when ob is distinct from nb then to_jsonb(old) end, cols, h, who);
      end if;
      -- The transaction's marker, once: its insert queues the fence (004), and every later row
      -- of the transaction only found it there (about 3 µs a row of a 50,000-row INSERT, of
      -- 23). The setting is the transaction's and is undone with a savepoint rolled back, as the
      -- marker is; the fence clears it as it folds, so a write after an early fence (SET
      -- CONSTRAINTS ALL IMMEDIATE, an app's deferred trigger firing after it) queues it again.
      -- Set before the insert: an immediate fence runs inside that insert, and clears it there.
      if current_setting('kizuna.marked', true) is distinct from x::text then
        perform set_config('kizuna.marked', x::text, true);
        insert into kizuna.tx_marker (xid) values (x) on conflict do nothing;
      end if;
      return null;
    end
    $cap$
  $f$, 'capture_' || oid_, 'place_' || oid_, t.name, cols_expr);

  execute format('create or replace trigger kizuna_capture after insert or update or delete on %s
                  for each row execute function kizuna.%I()', t.rel, 'capture_' || oid_);
  -- TRUNCATE fires no row triggers, so it would silently bypass sync: refuse it.
  execute format('create or replace trigger kizuna_no_truncate before truncate on %s
                  for each statement execute function kizuna.refuse_truncate()', t.rel);
  -- In replica sessions too: a logical replication subscriber applies its changes with
  -- session_replication_role = replica (so do restores that turn triggers off), where ordinary
  -- triggers do not fire, and clients never heard of those writes.
  execute format('alter table %s enable always trigger kizuna_capture, enable always trigger kizuna_no_truncate', t.rel);

  -- A key of coarser equality than its text (kizuna.key_is_exact) is found deleted under any
  -- spelling (kizuna.deleted_spelling) through an index of the table's tombstones by the key as
  -- its column compares it (kizuna.deleted_index names it). Not for a key whose text is read by
  -- the session's settings (timestamptz: TimeZone), which no index may hold.
  deleted_index := case when not kizuna.key_is_exact(t.rel, t.pk_column) and kizuna.key_input_is_immutable(t.rel, t.pk_column)
                        then kizuna.deleted_index(t.rel, t.pk_column, t.name) end;
  perform kizuna.drop_deleted_indexes(t.rel, keep => deleted_index);
  if deleted_index is not null then
    execute format('create index if not exists %I on kizuna.changes (%s) where tbl = %L and deleted',
                   deleted_index, kizuna.typed_key(t.rel, t.pk_column, 'pk'), t.name);
  end if;
  update kizuna.synced_tables
     set compiled_version = kizuna.compile_version(),
         pk_attnum = (select a.attnum from pg_attribute a where a.attrelid = t.rel and a.attname = t.pk_column and not a.attisdropped)
   where name = t.name;
end
$$;

-- Records which functions the bucket expression calls, or null when it reads a table: the
-- set-based push path (005_push_runs.sql) takes only tables whose rows' buckets depend on the row
-- alone. The expression is parsed as a check constraint of an empty temporary copy of the table
-- (never the table itself): PostgreSQL refuses subqueries there and records what it calls. Records
-- too whether its text may follow the session's settings (kizuna.tree_follows_settings; true when
-- it could not be analysed).
create or replace function kizuna.analyse_bucket(t kizuna.synced_tables) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  called oid[];
  follows boolean := true;
begin
  begin
    if to_regclass('pg_temp.kizuna_bucket_probe') is not null then
      drop table pg_temp.kizuna_bucket_probe;
    end if;
    execute format('create temporary table kizuna_bucket_probe (like %s)', t.rel);
    execute format('alter table pg_temp.kizuna_bucket_probe add constraint probe check (((%s)::text) is null or true) not valid',
                   t.bucket_expr);
    select coalesce(array_agg(distinct f), '{}') into called
      from pg_constraint k cross join lateral kizuna.called_functions('pg_constraint'::regclass, k.oid) f
     where k.conrelid = 'pg_temp.kizuna_bucket_probe'::regclass;
    select kizuna.tree_follows_settings(k.conbin::text) into follows
      from pg_constraint k where k.conrelid = 'pg_temp.kizuna_bucket_probe'::regclass;
    drop table pg_temp.kizuna_bucket_probe;
  exception when others then
    if kizuna.is_server_fault(sqlstate) then
      raise;
    end if;
    called := null;  -- a subquery, or anything a check constraint cannot hold
    follows := true;
  end;
  update kizuna.synced_tables set bucket_functions = called, bucket_follows_settings = follows where name = t.name;
end
$$;

-- TRUNCATE fires no row triggers, so it would bypass what a registration captures. Arguments, for
-- a registration other than sync's (universe sync, 009): what the table is, what TRUNCATE would
-- bypass, the function that unregisters it.
create or replace function kizuna.refuse_truncate() returns trigger language plpgsql as $$
begin
  raise exception 'kizuna: % is %; TRUNCATE would bypass % (use DELETE, or % first)', tg_table_name,
    coalesce(tg_argv[0], 'a synced table'), coalesce(tg_argv[1], 'sync'), coalesce(tg_argv[2], 'kizuna.unregister_table')
    using errcode = 'KZP05';
end
$$;

-- Has the fence number table `wire_name`'s entries as this transaction commits (kizuna.announcing):
-- every live entry (`every_entry`: a migration taken up), or only those a registration's backfill
-- wrote with kizuna.unnumbered(). Either way the fence lock is taken only then.
create or replace function kizuna.number_at_commit(wire_name text, every_entry boolean) returns void
language sql set search_path = pg_catalog, pg_temp as $$
  insert into kizuna.announcing as a (xid, tbl, every_entry) values (pg_current_xact_id(), wire_name, every_entry)
  on conflict (xid, tbl) do update set every_entry = a.every_entry or excluded.every_entry;
  insert into kizuna.tx_marker (xid) values (pg_current_xact_id()) on conflict do nothing;
$$;

-- Enters every row of synced table `wire_name` in the change log at one sequence number (a
-- registration's backfill): every current row gets its live entry under its key's one spelling;
-- entries whose row is gone, whose bucket changed (a new bucket expression) or whose key was
-- spelled otherwise (a pack before kizuna.key_spelling, under a session's settings) become
-- tombstones, and the row's column versions kept under another spelling move to its one.
create or replace function kizuna.enter_rows(wire_name text) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  tbl regclass;
  key_col name;
  key_type text;
  key_sql text;
  respelled boolean;
  s bigint;
begin
  select t.rel, t.pk_column into strict tbl, key_col from kizuna.synced_tables t where t.name = wire_name;
  key_type := kizuna.column_type(tbl, key_col);
  key_sql := kizuna.spell_key_sql(key_type, format('r.%I', key_col));
  respelled := kizuna.key_follows_settings(key_type);
  -- The number is the transaction's commit number, which the fence gives the entries written here
  -- as the transaction commits (kizuna.announcing): drawn here, the fence lock was held from this
  -- call to the end of the transaction, and every other synced commit of the database waited
  -- through the rest of a migration that registers a table. Until then they carry
  -- kizuna.unnumbered(), which no other transaction sees.
  s := kizuna.unnumbered();
  perform kizuna.number_at_commit(wire_name, false);
  execute format($q$
    insert into kizuna.changes as c (tbl, pk, bucket, seq, deleted, entered_seq)
    select $1, %4$s, b.b, $2, false, $2
      from %2$s r cross join lateral (select kizuna.%3$I(r) as b) b
     where b.b is not null
    on conflict (tbl, pk, bucket) do update
      set seq = excluded.seq, deleted = false, image = null, entered_seq = excluded.seq, changed_at = now()
      where c.deleted
  $q$, key_col, tbl, 'bucket_' || tbl::oid::text, key_sql) using wire_name, s;
  -- One join, not a lookup per entry: a table filled in the same transaction has no statistics
  -- yet, and the planner's lookups became a scan of the table per entry (30,000 rows took 30 s).
  -- An entry under another spelling of a row's key (a key whose text follows a setting) names
  -- that row: its tombstone keeps the row's image, through which a caller's SELECT policy lets
  -- the device that holds the old spelling see it go.
  execute format($q$
    update kizuna.changes c
       set deleted = true, seq = $2, changed_at = now(), image = gone.image
      from (select e.pk, e.bucket, %5$s as image
              from kizuna.changes e
              left join (select %4$s as pk, kizuna.%3$I(r) as bucket, to_jsonb(r) as image from %2$s r) now_
                on now_.pk = e.pk
              %6$s
             where e.tbl = $1 and not e.deleted and now_.bucket is distinct from e.bucket) gone
     where c.tbl = $1 and c.pk = gone.pk and c.bucket = gone.bucket
  $q$, key_col, tbl, 'bucket_' || tbl::oid::text, key_sql,
       case when respelled then 'coalesce(now_.image, same.image)' else 'now_.image' end,
       case when respelled
            then format('left join lateral (select to_jsonb(r) as image from %s r where now_.pk is null and r.%I = %s limit 1) same on true',
                        tbl, key_col, kizuna.typed_key(tbl, key_col, 'e.pk'))
            else '' end) using wire_name, s;
  -- The per-column versions kept under another spelling of a row's key order that row's writes
  -- (hlc and journaled tables): under it, they ordered none, and an edit made offline before the
  -- row's last write took the column back. Moved to the one spelling; of two versions of a
  -- column, the later commit's is the one the row holds.
  if respelled then
    execute format($q$
      with moved as (
        delete from kizuna.column_versions v using %2$s r
         where v.tbl = $1 and r.%1$I = %3$s and v.pk <> %4$s
        returning %4$s as pk, v.col, v.seq, v.hlc, v.writer, v.client
      )
      insert into kizuna.column_versions as v (tbl, pk, col, seq, hlc, writer, client)
      select distinct on (pk, col) $1, pk, col, seq, hlc, writer, client from moved order by pk, col, seq desc
      on conflict (tbl, pk, col) do update
        set seq = excluded.seq, hlc = excluded.hlc, writer = excluded.writer, client = excluded.client
        where excluded.seq > v.seq
    $q$, key_col, tbl, kizuna.typed_key(tbl, key_col, 'v.pk'), key_sql) using wire_name;
  end if;
end
$$;

-- Registers (or re-registers) a synced table.
--   tbl            the table
--   bucket         SQL expression over the row's columns giving its bucket (text), e.g. $$'user:' || owner$$;
--                  null means the row is in no bucket and is not synced
--   conflict_mode  'arrival' (default: the later accepted arrival holds a contested column) or 'hlc'
--   max_batch_size more mutations than this in one push request answer KZP02
--   journal        keep the losing value of contested columns (kizuna.conflicts)
--   gate           validation gate fn(op text, row jsonb) returns boolean; false or SQLSTATE KZV01
--                  answers VALIDATION_FAILED
--   pk_column      defaults to the table's single-column primary key
--   name           the table's name on the wire; defaults to the table's own name
-- Existing rows are entered into the change log at one new sequence number (not again when the
-- table is registered already with the same key and bucket expression: only its settings change).
create or replace function kizuna.register_table(
  tbl regclass,
  bucket text,
  conflict_mode text default 'arrival',
  max_batch_size integer default 500,
  journal boolean default false,
  gate regprocedure default null,
  pk_column name default null,
  name text default null
) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp set kizuna.registering = 'on' as $$
declare
  wire_name text := coalesce(name, (select relname from pg_class where oid = tbl));
  key_col name := pk_column;
  dropped regclass;
  before kizuna.synced_tables;
begin
  if key_col is null then
    select a.attname into key_col
      from pg_index i join pg_attribute a on a.attrelid = i.indrelid and a.attnum = i.indkey[0]
     where i.indrelid = tbl and i.indisprimary and i.indnatts = 1;
    if key_col is null then
      raise exception 'kizuna.register_table: % has no single-column primary key; pass pk_column', tbl;
    end if;
  elsif kizuna.column_type(tbl, key_col) is null then
    raise exception 'kizuna.register_table: % has no column %', tbl, key_col;
  end if;
  -- A table dropped outright (DROP TABLE ... CASCADE, not unregister_table) leaves its registry
  -- row: its name is free for the table that replaces it, whose backfill below turns the old
  -- table's entries into tombstones unless it has the same keys. Its column versions go: they
  -- ordered writes to rows that are gone; so does its tombstone index (CASCADE leaves it: it is an
  -- index of the change log, not of the table).
  for dropped in select t.rel from kizuna.synced_tables t where t.name = wire_name and t.rel <> tbl
                 and not exists (select 1 from pg_class c where c.oid = t.rel) loop
    perform kizuna.drop_deleted_indexes(dropped);
    delete from kizuna.synced_tables t where t.name = wire_name;
    delete from kizuna.column_versions v where v.tbl = wire_name;
  end loop;
  if exists (select 1 from kizuna.synced_tables t where t.name = wire_name and t.rel <> tbl) then
    raise exception 'kizuna.register_table: the name % is taken by another table', wire_name;
  end if;
  if conflict_mode not in ('arrival', 'hlc') then
    raise exception 'kizuna.register_table: conflict_mode must be arrival or hlc, not %', conflict_mode;
  end if;

  select * into before from kizuna.synced_tables t where t.name = wire_name and t.rel = tbl;
  delete from kizuna.synced_tables t where t.rel = tbl and t.name <> wire_name;
  insert into kizuna.synced_tables as t (name, rel, pk_column, bucket_expr, conflict_mode, max_batch_size, journal, gate)
  values (wire_name, tbl, key_col, bucket, conflict_mode, max_batch_size, journal, gate)
  on conflict on constraint synced_tables_pkey do update
    set pk_column = excluded.pk_column, bucket_expr = excluded.bucket_expr,
        conflict_mode = excluded.conflict_mode, max_batch_size = excluded.max_batch_size,
        journal = excluded.journal, gate = excluded.gate;
  perform kizuna.compile_table(wire_name);
  perform kizuna.take_up_shape(wire_name);
  -- Registered already, with the same key and bucket expression: its triggers have kept the log
  -- whole, so there is nothing to enter again (re-running an app's setup SQL at every start must
  -- not scan the table: 30,000 rows took 25 s).
  if before.name is not null and before.pk_column = key_col and before.bucket_expr = bucket then
    return;
  end if;

  perform kizuna.enter_rows(wire_name);
end
$$;

-- Takes up a migration of synced table `wire_name`: records its columns (kizuna.table_shape) and,
-- when they changed since they were last recorded (a migration added, dropped, renamed or retyped
-- one, which fires no row trigger), has every live entry announced again at the transaction's
-- commit number. Devices hold its rows as they were, and a pull brings a row only when it changes:
-- so each device's next pull brings every row as it is now. (A registration before the pack kept
-- shapes records one.) The fence announces them as the transaction commits (kizuna.announcing):
-- numbered here, the fence lock was held from the ALTER to the end of the migration's
-- transaction, and every other synced commit of the database waited through its backfill.
create or replace function kizuna.take_up_shape(wire_name text) returns void
language plpgsql set search_path = pg_catalog, pg_temp as $$
declare
  recorded text;
  now_shape text;
begin
  select t.shape, kizuna.table_shape(t.rel) into recorded, now_shape from kizuna.synced_tables t where t.name = wire_name;
  if recorded is not distinct from now_shape then
    return;
  end if;
  update kizuna.synced_tables t set shape = now_shape where t.name = wire_name;
  if recorded is not null then
    perform kizuna.number_at_commit(wire_name, true);
  end if;
end
$$;

-- Follows a migration of a synced table as it commits (an event trigger at the end of each ALTER
-- TABLE, where the pack was installed by a superuser): recompiles the table's functions and takes
-- up its new columns, as registering it again would. Without it, devices kept their copy of every
-- row without an added column (or with a retyped column's old spelling) until the row changed, or
-- until the app's setup registered the table again. A renamed key column is followed under its new
-- name (by its attribute number, synced_tables.pk_attnum). A migration the registration cannot
-- follow (the key column dropped, a column the bucket expression names renamed or dropped) is let
-- through with a warning: pushes to the table then fail as the server's fault until it is
-- registered again (kizuna.key_type_of).
create or replace function kizuna.follow_migration() returns event_trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  t kizuna.synced_tables;
  renamed name;
begin
  if current_setting('kizuna.registering', true) = 'on' then
    return;
  end if;
  for t in select s.* from kizuna.synced_tables s
            where s.shape is not null
              and s.rel in (select c.objid from pg_event_trigger_ddl_commands() c where c.classid = 'pg_class'::regclass)
              and s.shape is distinct from kizuna.table_shape(s.rel) loop
    begin
      if kizuna.column_type(t.rel, t.pk_column) is null then
        -- Renamed: the same attribute under another name is still the key (the wire's keys are
        -- its values as text, unchanged). Dropped: nothing to follow.
        select a.attname into renamed from pg_attribute a
         where a.attrelid = t.rel and a.attnum = t.pk_attnum and not a.attisdropped;
        if renamed is null then
          raise exception 'its key column % is gone', t.pk_column;
        end if;
        update kizuna.synced_tables s set pk_column = renamed where s.name = t.name;
      end if;
      perform kizuna.compile_table(t.name);
      perform kizuna.take_up_shape(t.name);
      -- Its compiled bucket must still read the row: a renamed bucket column fails here.
      execute format('select kizuna.%I(r) from %s r limit 1', 'bucket_' || t.rel::oid::text, t.rel);
    exception when others then
      raise warning 'kizuna: the migration of synced table % cannot be followed (%): register it again with kizuna.register_table', t.rel, sqlerrm;
    end;
  end loop;
exception when others then
  -- Never the reason an operator's ALTER TABLE fails.
  raise warning 'kizuna: migrations cannot be followed (%): register migrated tables again with kizuna.register_table', sqlerrm;
end
$$;

select kizuna.ensure_event_trigger('kizuna_follow_migration', 'kizuna.follow_migration', array['ALTER TABLE'],
  'kizuna: following migrations needs an event trigger, which needs a superuser: register a table again after migrating it');

-- Stops syncing a table: drops its triggers and compiled functions and forgets its log.
-- Clients keep the rows they have; re-registering enters the current rows again.
create or replace function kizuna.unregister_table(tbl regclass) returns void
language plpgsql security definer set search_path = pg_catalog, public, pg_temp as $$
declare
  wire_name text := (select name from kizuna.synced_tables where rel = tbl);
begin
  execute format('drop trigger if exists kizuna_capture on %s', tbl);
  execute format('drop trigger if exists kizuna_no_truncate on %s', tbl);
  execute format('drop function if exists kizuna.%I()', 'capture_' || tbl::oid::text);
  execute format('drop function if exists kizuna.%I(%s)', 'bucket_' || tbl::oid::text, tbl);
  execute format('drop function if exists kizuna.%I(%s)', 'place_' || tbl::oid::text, tbl);
  perform kizuna.drop_deleted_indexes(tbl);
  delete from kizuna.changes where kizuna.changes.tbl = wire_name;
  delete from kizuna.column_versions where kizuna.column_versions.tbl = wire_name;
  delete from kizuna.synced_tables where rel = tbl;
end
$$;

-- A new pack version may change the capture template: recompile what was compiled by an older one.
do $$
declare
  n text;
  v integer;
begin
  for n, v in select name, compiled_version from kizuna.synced_tables where compiled_version < kizuna.compile_version() loop
    perform kizuna.compile_table(n);
    -- Compiled before keys were spelled by no session's settings (version 12): a key whose text
    -- follows them may be in the change log under another spelling, which devices hold as a
    -- second row. Entered again: the row under its one spelling, the other a tombstone.
    -- Compiled before a bucket expression that follows settings ran under fixed ones (version 13):
    -- a row may be in the bucket its writer's session rendered. Entered again: the row in its one
    -- bucket, the entry in the other a tombstone.
    if exists (select 1 from kizuna.synced_tables t where t.name = n
                and (v < 12 and kizuna.key_follows_settings(kizuna.column_type(t.rel, t.pk_column))
                     or v < 13 and t.bucket_follows_settings)) then
      perform kizuna.enter_rows(n);
    end if;
  end loop;
  -- Tables compiled before the key's attribute number was kept (kizuna.follow_migration).
  update kizuna.synced_tables t set pk_attnum = a.attnum
    from pg_attribute a
   where t.pk_attnum is null and a.attrelid = t.rel and a.attname = t.pk_column and not a.attisdropped;
end
$$;
