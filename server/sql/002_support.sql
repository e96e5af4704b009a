-- Kizuna SQL pack, file 2 of 10: small helpers shared by push and pull.
--
-- Everything that touches a user table here runs as the caller (SECURITY INVOKER), so the table's
-- own Row Level Security decides. Table and column names only ever come from the catalog and are
-- quoted with format('%I'); nothing a client sends is spliced into SQL.

-- Raises a whole-request error with one of the pack's SQLSTATEs (KZP01..KZP04).
-- A detail or hint that is not given is left out (PostgREST then answers null, not ""): RAISE
-- refuses a null option, hence the four forms.
create or replace function kizuna.fail(code text, message text, detail text default null, hint text default null)
returns void language plpgsql as $$
begin
  if detail is null and hint is null then
    raise exception using errcode = code, message = message;
  elsif detail is null then
    raise exception using errcode = code, message = message, hint = hint;
  elsif hint is null then
    raise exception using errcode = code, message = message, detail = detail;
  end if;
  raise exception using errcode = code, message = message, detail = detail, hint = hint;
end
$$;

-- Who is calling: the JWT's sub, else the role the request runs as ('role:anon', 'role:postgres').
-- It reads the role setting rather than current_user so that it names the same caller inside the
-- pack's SECURITY DEFINER helpers and triggers, where current_user is the pack's owner.
create or replace function kizuna.caller() returns text language sql stable as $$
  select coalesce(nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub',
                  'role:' || coalesce(nullif(current_setting('role'), 'none'), session_user))
$$;

-- Hybrid logical clocks, client format <13-digit ms>-<4-digit counter>-<node>, ordered lexically.
-- That is ^[0-9]{13}-[0-9]{4}-[A-Za-z0-9_:.-]{1,64}$, written without counted repetitions (which
-- make PostgreSQL's regular expressions about three times slower): the first two hyphens at 14 and
-- 19 fix the digit runs, the length the node's.
create or replace function kizuna.hlc_is_valid(h text) returns boolean language sql immutable as $$
  select h ~ '^[0-9]+-[0-9]+-[A-Za-z0-9_:.-]+$' and substr(h, 14, 1) = '-' and substr(h, 19, 1) = '-'
     and length(h) between 20 and 83
$$;

-- Server time as an HLC: stamps writes made without one (plain SQL, hlc omitted).
create or replace function kizuna.hlc_now() returns text language sql volatile as $$
  select lpad(floor(extract(epoch from clock_timestamp()) * 1000)::bigint::text, 13, '0') || '-0000-server'
$$;

-- An origin HLC never orders after server time plus the documented maximum skew.
create or replace function kizuna.hlc_clamp(h text) returns text language sql volatile as $$
  select case when substr(h, 1, 13)::bigint > lim then lpad(lim::text, 13, '0') || substr(h, 14) else h end
    from (select floor(extract(epoch from clock_timestamp() + s.hlc_max_skew) * 1000)::bigint as lim
            from kizuna.settings s) l
$$;

-- The SQL type of a table's column, from the catalog (for casts of the wire's text keys), without
-- its length or precision: an explicit cast to varchar(8) or numeric(6, 2) cuts or rounds quietly,
-- so a key one character too long named the row of its first eight (a delete removed it).
-- PL/pgSQL, as the catalog lookups below that every push makes: a SQL function that reads a table
-- is not inlined, and its body was planned again in each transaction (0.1 – 0.2 ms a call, a
-- tenth of a lone write's push inside the database), where PL/pgSQL keeps its plans per session.
create or replace function kizuna.column_type(rel regclass, col name) returns text language plpgsql stable as $$
begin
  return (select format_type(a.atttypid, null)
            from pg_attribute a where a.attrelid = rel and a.attname = col and a.attnum > 0 and not a.attisdropped);
end
$$;

-- Writable columns of a table: name -> true. Generated and dropped columns are not writable.
create or replace function kizuna.writable_columns(rel regclass) returns jsonb language sql stable as $$
  select coalesce(jsonb_object_agg(a.attname, true), '{}')
    from pg_attribute a
   where a.attrelid = rel and a.attnum > 0 and not a.attisdropped and a.attgenerated = ''
$$;

-- Errors that are faults of the server itself, not of one mutation: connection, transaction state,
-- serialization failure and deadlock, resources (memory, disk, connections), locks not available,
-- operator intervention and shutdown, system errors, corrupt data or indexes. They fail the whole
-- request, which the gateway answers 5xx and the client retries; every other error refuses the one
-- mutation. XX000 (internal_error) is not among them: it is what an extension's C code raises when
-- it has no better code, for the data it was given (PostGIS: "parse error - invalid geometry"), so
-- one such write failed every push of its device forever, and retrying never helps it.
create or replace function kizuna.is_server_fault(state text) returns boolean language sql immutable as $$
  select left(state, 2) in ('08', '25', '2D', '3B', '40', '53', '55', '57', '58', '72', 'F0', 'HV')
      or state in ('XX001', 'XX002')
$$;

-- The SET clauses under which the pack writes a value as text the same for every session: ISO
-- dates, UTC with its offset, floats that read back exactly, hex bytea, C locale for money and
-- numbers (to_char). One text, for kizuna.key_spelling and for the compiled bucket functions of
-- tables whose bucket expression follows settings (kizuna.compile_table).
create or replace function kizuna.fixed_settings() returns text language sql immutable as $$
  select $s$set datestyle = 'ISO, MDY' set timezone = 'UTC' set intervalstyle = 'postgres' set extra_float_digits = 1
    set bytea_output = 'hex' set lc_monetary = 'C' set lc_numeric = 'C'$s$
$$;

-- A key value as text, whatever the settings of the session that reads it. A timestamptz is
-- written as text by TimeZone and DateStyle, a date or time by DateStyle, an interval by
-- IntervalStyle, a float by extra_float_digits, bytea by bytea_output, money by lc_monetary: a row
-- written by a session with other settings (an admin's psql in Asia/Tokyo) was entered in the
-- change log under a second spelling of its key, and every device held it twice. Under the
-- settings here, each spelling is one any session reads back as the same value (ISO dates, an
-- explicit UTC offset, floats that round-trip). PL/pgSQL: a SQL function with SET clauses is
-- planned again at each call from another SQL function (the capture trigger's reading of a row),
-- 12 µs a call where this costs 4 (100,000 calls). kizuna.spell_key_sql calls it only for the
-- types whose text follows a setting.
do $do$
begin
  execute format($f$
    create or replace function kizuna.key_spelling(key anyelement) returns text language plpgsql stable %s
    as $$
    begin
      return key::text;
    end
    $$
  $f$, kizuna.fixed_settings());
end
$do$;

-- True unless the text of a value of type `typ` is the same under any setting of the session: text
-- and character types, uuid, integers, numeric, boolean, network and bit types, json and jsonb
-- (their numbers are numeric), enums, citext, and domains over them. A type it cannot find (null,
-- an oid that names none) follows them, to be safe.
create or replace function kizuna.type_follows_settings(typ oid) returns boolean language plpgsql stable as $$
begin
  return coalesce((
    select not (b.typtype = 'e' or b.typname = 'citext'
                or b.typnamespace = 'pg_catalog'::regnamespace
                   and b.typname in ('text', 'varchar', 'bpchar', 'name', 'char', 'uuid', 'int2', 'int4', 'int8', 'oid',
                                     'numeric', 'bool', 'inet', 'cidr', 'macaddr', 'macaddr8', 'bit', 'varbit', 'json', 'jsonb'))
      from pg_type y join pg_type b on b.oid = coalesce(nullif(y.typbasetype, 0), y.oid)
     where y.oid = typ), true);
end
$$;

-- kizuna.type_follows_settings of the type `key_type` names (as format_type names it).
create or replace function kizuna.key_follows_settings(key_type text) returns boolean language plpgsql stable as $$
begin
  return kizuna.type_follows_settings(to_regtype(key_type));
end
$$;

-- SQL text of `expr` (SQL text of a value of type `key_type`) as its key's one spelling: through
-- kizuna.key_spelling where the type's text follows a setting, a plain cast elsewhere. Every path
-- that spells a key as text, from a client or from a row, spells it so.
create or replace function kizuna.spell_key_sql(key_type text, expr text) returns text language sql stable as $$
  select case when kizuna.key_follows_settings(key_type) then format('kizuna.key_spelling(%s)', expr)
              else format('(%s)::text', expr) end
$$;

-- kizuna.spell_key_sql of key column `col` of table `rel`, read from the row named `row_sql`
-- (SQL text: `r`, `(kz_row)`).
create or replace function kizuna.spell_column_sql(rel regclass, col name, row_sql text) returns text language sql stable as $$
  select kizuna.spell_key_sql(kizuna.column_type(rel, col), format('%s.%I', row_sql, col))
$$;

-- A key in its one spelling: `raw` cast to the key column's type and back to text (an upper-case
-- uuid in lower case, `007` as `7`, a timestamptz in UTC), or null when it is no value of that
-- type, whatever the type raises for it (a data exception, a domain's CHECK). Read by the session's
-- settings as the row it names is written, spelled by none (kizuna.key_spelling). The change log,
-- column versions and key locks compare keys as text, so every path that takes a key from a client
-- spells it here. A fault of the server still fails the request.
create or replace function kizuna.key_text(key_type text, raw text) returns text
language plpgsql stable as $$
declare
  key text;
begin
  if key_type = 'text' or raw is null then
    return raw;  -- before the block below: entering it costs a subtransaction
  end if;
  begin
    execute 'select ' || kizuna.spell_key_sql(key_type, format('cast($1 as %s)', key_type)) into key using raw;
  exception when others then
    if kizuna.is_server_fault(sqlstate) then
      raise;
    end if;
    key := null;
  end;
  return key;
end
$$;

-- True when a key column's equality is its text's: two values of the column are equal exactly
-- when `kizuna.key_text` spells them alike (text, varchar and char with a deterministic collation,
-- uuid, integers, boolean, date). Otherwise (numeric: 1.0 = 1.00; citext: 'Ann' = 'ann'; a
-- nondeterministic collation; a domain; any other type) one row answers to several spellings.
create or replace function kizuna.key_is_exact(rel regclass, col name) returns boolean language sql stable as $$
  select coalesce((
    select y.typname in ('text', 'varchar', 'bpchar', 'uuid', 'int2', 'int4', 'int8', 'bool', 'date')
           and coalesce((select l.collisdeterministic from pg_collation l where l.oid = a.attcollation), true)
      from pg_attribute a join pg_type y on y.oid = a.atttypid
     where a.attrelid = rel and a.attname = col and a.attnum > 0 and not a.attisdropped), false)
$$;

-- A table's columns, names and types in order, as one text (hashed): what a migration changes.
create or replace function kizuna.table_shape(rel regclass) returns text language sql stable as $$
  select md5(string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' order by a.attnum))
    from pg_attribute a where a.attrelid = rel and a.attnum > 0 and not a.attisdropped
$$;

-- Creates the pack's event trigger `name` at ddl_command_end, for the commands `tags` (null: every
-- one), calling `fn`, and enables it always (in replica sessions too). Creating one needs a
-- superuser: without one, it says `without` and the pack goes on without it.
create or replace function kizuna.ensure_event_trigger(name text, fn text, tags text[], without text) returns void
language plpgsql as $$
begin
  if not exists (select 1 from pg_event_trigger where evtname = name) then
    begin
      execute format('create event trigger %I on ddl_command_end %s execute function %s()', name,
                     case when tags is null then ''
                          else format('when tag in (%s)', (select string_agg(quote_literal(t), ', ') from unnest(tags) t)) end, fn);
    exception when insufficient_privilege then
      raise notice '%', without;
    end;
  end if;
  if exists (select 1 from pg_event_trigger where evtname = name and evtenabled <> 'A') then
    execute format('alter event trigger %I enable always', name);
  end if;
end
$$;

-- Fails the request as the server's fault (SQLSTATE 55000: the gateway answers 500, the client
-- retries, nothing is lost) because synced table `t` no longer matches its registration: a column
-- its key or bucket names was renamed or dropped. Writes to it were refused SCHEMA_MISMATCH, a
-- verdict the client settles by dropping the write; registering the table again puts it right.
create or replace function kizuna.fail_stale_registration(t kizuna.synced_tables) returns void
language plpgsql as $$
begin
  perform kizuna.fail('55000', format('the synced table %s no longer matches its registration (a column its key or bucket '
                                      'names was renamed or dropped): register it again with kizuna.register_table', t.rel));
end
$$;

-- The type of synced table `t`'s key column; fails the request when the column is gone. Null when
-- the table itself is gone (dropped, not unregistered): no table to wait for, so its writes are
-- refused as a table that is not synced.
create or replace function kizuna.key_type_of(t kizuna.synced_tables) returns text language plpgsql stable as $$
declare
  key_type constant text := kizuna.column_type(t.rel, t.pk_column);
begin
  if key_type is null and exists (select 1 from pg_class c where c.oid = t.rel) then
    perform kizuna.fail_stale_registration(t);
  end if;
  return key_type;
end
$$;

-- Fails the request as kizuna.fail_stale_registration does when an error (its
-- `pg_exception_context`) was raised in the functions compiled for synced table `t`: its bucket, the
-- capture trigger's reading of a row. A column they name is gone.
create or replace function kizuna.fail_if_raised_in_registration(t kizuna.synced_tables, context text) returns void
language plpgsql as $$
begin
  if strpos(context, format('SQL function "place_%s"', t.rel::oid)) > 0
     or strpos(context, format('SQL function "bucket_%s"', t.rel::oid)) > 0 then
    perform kizuna.fail_stale_registration(t);
  end if;
end
$$;

-- `key` (a key as text) as a value of the type of `type_of` (a null of that type), or null when it
-- is none. The change log's index of a coarse key's tombstones (kizuna.typed_key) reads every
-- deleted key through it, and a key of the column's type before a migration changed it may be no
-- value of the type now (numeric to text: `abc`): cast in the index, it failed every transaction
-- that deleted such a key until the table was registered again. Immutable as the type's input
-- is: the index is only made for such types (kizuna.key_input_is_immutable).
create or replace function kizuna.key_as(key text, type_of anyelement) returns anyelement
language plpgsql immutable as $$
declare
  result alias for $0;
begin
  result := key;  -- in the block: RETURN would convert `key` to the result's type after it
  return result;
exception when others then
  if kizuna.is_server_fault(sqlstate) then
    raise;
  end if;
  return null;
end
$$;

-- True when the key column's type reads its text alike whatever the session's settings (its
-- base type's input function is immutable): numeric and citext, not timestamptz (TimeZone).
create or replace function kizuna.key_input_is_immutable(rel regclass, col name) returns boolean language sql stable as $$
  select coalesce((
    select p.provolatile = 'i'
      from pg_attribute a join pg_type y on y.oid = a.atttypid
      join pg_type b on b.oid = coalesce(nullif(y.typbasetype, 0), y.oid) join pg_proc p on p.oid = b.typinput
     where a.attrelid = rel and a.attname = col and a.attnum > 0 and not a.attisdropped), false)
$$;

-- `expr` (SQL text of a text value) as the key column `col` compares it: a value of the column's
-- type (kizuna.key_as), in the column's collation when that is not its type's. The change log's
-- index of a table's deleted keys (kizuna.compile_table) and the lookup through it
-- (kizuna.deleted_spelling) spell it alike, so the planner matches the two; schema-qualified, so
-- the text is the same whatever the search_path.
create or replace function kizuna.typed_key(rel regclass, col name, expr text) returns text language sql stable as $$
  select format('(kizuna.key_as(%s, null::%I.%I)%s)', expr, tn.nspname, y.typname,
                case when a.attcollation <> 0 and a.attcollation <> y.typcollation
                     then (select format(' collate %I.%I', n.nspname, l.collname)
                             from pg_collation l join pg_namespace n on n.oid = l.collnamespace where l.oid = a.attcollation)
                     else '' end)
    from pg_attribute a join pg_type y on y.oid = a.atttypid join pg_namespace tn on tn.oid = y.typnamespace
   where a.attrelid = rel and a.attname = col and a.attnum > 0 and not a.attisdropped
$$;

-- The name of the index of the deleted keys of table `rel` (wire name `wire_name`, key column
-- `col`): named for the table, its wire name and how its key compares, so that compiling again
-- (every app start registers its tables) builds it only when one of them changed.
create or replace function kizuna.deleted_index(rel regclass, col name, wire_name text) returns text language sql stable as $$
  select 'changes_deleted_' || rel::oid::text || '_' || left(md5(wire_name || kizuna.typed_key(rel, col, 'pk')), 8)
$$;

-- The equality operator of the key column's type (its default btree class's), schema-qualified: a
-- function whose search_path holds only pg_catalog otherwise compares a citext as text.
create or replace function kizuna.key_equality(rel regclass, col name) returns text language sql stable as $$
  select format('operator(%I.%s)', n.nspname, o.oprname)
    from pg_attribute a
    join pg_opclass c on c.opcintype = a.atttypid and c.opcdefault and c.opcmethod = (select m.oid from pg_am m where m.amname = 'btree')
    join pg_amop p on p.amopfamily = c.opcfamily and p.amopstrategy = 3 and p.amoplefttype = c.opcintype and p.amoprighttype = c.opcintype
    join pg_operator o on o.oid = p.amopopr
    join pg_namespace n on n.oid = o.oprnamespace
   where a.attrelid = rel and a.attname = col and a.attnum > 0 and not a.attisdropped
$$;

-- How the change log spells a deleted key equal to `key` under its column's equality (a tombstone
-- of `1.0` for `1.00`), or null: a key of coarser equality than its text is found deleted under
-- any spelling of it. Only a key with no live entry: the spelling of a row the caller may not see
-- stays unsaid. Through the index kizuna.compile_table makes of the table's deleted keys.
create or replace function kizuna.deleted_spelling(rel regclass, col name, key text) returns text
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
  wire_name text := (select t.name from kizuna.synced_tables t where t.rel = deleted_spelling.rel);
  found text;
begin
  -- No index: a key whose text is read by the session's settings (timestamptz: TimeZone), which
  -- no index may hold, or one whose type changed since the table was registered (its next
  -- registration makes the index). Such a key is looked up by its text only.
  if wire_name is null or to_regclass(format('kizuna.%I', kizuna.deleted_index(rel, col, wire_name))) is null then
    return null;
  end if;
  execute format($q$select c.pk from kizuna.changes c
                    where c.tbl = %L and c.deleted and %s %s %s
                      and not exists (select 1 from kizuna.changes l where l.tbl = c.tbl and l.pk = c.pk and not l.deleted)
                    order by c.seq desc limit 1$q$,
                 wire_name, kizuna.typed_key(rel, col, 'c.pk'), kizuna.key_equality(rel, col), kizuna.typed_key(rel, col, '$1'))
    into found using key;
  return found;
end
$$;

-- The key of the row `key` names, as that row spells it: for a column whose equality is coarser
-- than its text (`kizuna.key_is_exact`), a write of 1.00 lands on the row stored as 1.0, whose key
-- the capture trigger, so the change log and every pull, spell 1.0. Naming the key as the row does
-- keeps one key for one row in the key locks, the column versions and the verdict (which moves the
-- writer's row there; it kept a row under 1.00 that no pull ever brought or removed). When no row
-- the caller may see has it, the key as a tombstone of the change log spells it
-- (kizuna.deleted_spelling), so it is found deleted (an upsert of 1.00 recreated the row deleted
-- as 1.0); else `key` as given (a new row is stored as written), also when reading fails other
-- than by the server's fault.
create or replace function kizuna.stored_key(rel regclass, col name, key_type text, key text) returns text
language plpgsql stable as $$
declare
  found text;
begin
  if key is null or kizuna.key_is_exact(rel, col) then
    return key;
  end if;
  begin
    execute format('select %4$s from %2$s t where t.%1$I = cast($1 as %3$s) limit 1', col, rel, key_type,
                   kizuna.spell_key_sql(key_type, format('t.%I', col)))
      into found using key;
  exception when others then
    if kizuna.is_server_fault(sqlstate) then
      raise;
    end if;
  end;
  if found is null then
    begin
      found := kizuna.deleted_spelling(rel, col, key);
    exception when others then
      if kizuna.is_server_fault(sqlstate) then
        raise;
      end if;
    end;
  end if;
  return coalesce(found, key);
end
$$;

-- The row as the caller's SELECT policy renders it, or null.
create or replace function kizuna.render_row(rel regclass, pk_column name, pk text) returns jsonb
language plpgsql stable as $$
declare
  r jsonb;
begin
  execute format('select to_jsonb(t) from %s t where t.%I = cast($1 as %s)',
                 rel, pk_column, kizuna.column_type(rel, pk_column))
    into r using pk;
  return r;
exception
  when others then
    -- A key that is no valid value of the column, no privilege, a policy that raises: the caller
    -- is shown no row. Faults of the server still fail the request.
    if kizuna.is_server_fault(sqlstate) then
      raise;
    end if;
    return null;
end
$$;

-- Which of `images` (row images of `rel`, of rows no longer in the table: tombstones) the
-- caller's SELECT policy renders, as their positions in the array: the table's policies are
-- evaluated over the images, as the caller, exactly as PostgreSQL combines them (permissive OR'ed,
-- restrictive AND'ed, roles matched by membership), in one query for them all (one per image made
-- a returning device's run over 20,000 deletes spend 45 us a tombstone, twice).
create or replace function kizuna.visible_images(rel regclass, images jsonb[]) returns setof integer
language plpgsql stable as $$
declare
  c pg_class;
  permissive text;
  restrictive text;
  query text;
  found integer[];
begin
  if coalesce(cardinality(images), 0) = 0 or not has_table_privilege(rel, 'SELECT') then
    return;
  end if;
  select * into c from pg_class where oid = rel;
  if not c.relrowsecurity
     or (select rolbypassrls from pg_roles where rolname = current_user)
     or (pg_has_role(current_user, c.relowner, 'usage') and not c.relforcerowsecurity) then
    return query select i from generate_subscripts(images, 1) i where images[i] is not null;
    return;
  end if;
  select string_agg('(' || pg_get_expr(p.polqual, p.polrelid) || ')', ' or ') filter (where p.polpermissive),
         string_agg('(' || pg_get_expr(p.polqual, p.polrelid) || ')', ' and ') filter (where not p.polpermissive)
    into permissive, restrictive
    from pg_policy p
   where p.polrelid = rel and p.polcmd in ('r', '*') and p.polqual is not null
     and (0 = any (p.polroles) or exists (select 1 from unnest(p.polroles) r(oid)
                                           where pg_has_role(current_user, r.oid, 'member')));
  if permissive is null then
    return;
  end if;
  query := format('select array_agg(u.i::integer) from unnest($1) with ordinality u(image, i)
                     cross join lateral jsonb_populate_record(null::%s, u.image) as %I
                    where u.image is not null and (%s) and (%s)',
                  rel, c.relname, permissive, coalesce(restrictive, 'true'));
  begin
    execute query into found using images;
  exception when data_exception then
    -- A column's type changed since some images were taken (a tombstone is kept for days): the
    -- policies see the values that still read as their column's type, and null for the others,
    -- instead of every pull that reaches such a tombstone failing until it is reaped.
    execute query into found using array(select kizuna.image_as_today(rel, images[i])
                                           from generate_subscripts(images, 1) i order by i);
  end;
  return query select unnest(found);
end
$$;

-- Every caller judges tombstones through visible_images now; the one-image form is gone.
drop function if exists kizuna.image_visible(regclass, jsonb);

-- The values of a row image that still read as their column's type today.
create or replace function kizuna.image_as_today(rel regclass, image jsonb) returns jsonb
language plpgsql stable as $$
declare
  kept jsonb := '{}';
  k text;
  v jsonb;
begin
  for k, v in select * from jsonb_each(image) loop
    begin
      execute format('select jsonb_populate_record(null::%s, $1)', rel) using jsonb_build_object(k, v);
      kept := kept || jsonb_build_object(k, v);
    exception when data_exception then
      null;
    end;
  end loop;
  return kept;
end
$$;

-- The functions a stored expression (a policy, a check, a default, a constraint) calls, directly
-- or as an operator's function, as PostgreSQL recorded them (built-in ones are not recorded).
create or replace function kizuna.called_functions(cls regclass, obj oid) returns setof oid
language plpgsql stable as $$
begin
  return query
    select d.refobjid from pg_depend d
     where d.classid = cls and d.objid = obj and d.refclassid = 'pg_proc'::regclass
    union
    select o.oprcode::oid from pg_depend d join pg_operator o on o.oid = d.refobjid
     where d.classid = cls and d.objid = obj and d.refclassid = 'pg_operator'::regclass;
end
$$;

-- A function whose result depends on its arguments and the request's claims only, never on rows:
-- immutable ones, and auth.uid(), auth.jwt(), auth.role() (they read request.jwt.claims).
create or replace function kizuna.is_pure_function(f oid) returns boolean language plpgsql stable as $$
begin
  return coalesce((select p.provolatile = 'i'
                       or (p.pronamespace = 'auth'::regnamespace and p.proname in ('uid', 'jwt', 'role') and p.pronargs = 0)
                     from pg_proc p where p.oid = f), false);
end
$$;

-- Whether an expression, as PostgreSQL stores it (`tree`: a pg_node_tree as text, such as a check
-- constraint's conbin), may give text that follows the session's settings: some value in it is of a
-- type whose text follows them (kizuna.type_follows_settings: a column, a constant, a cast's or a
-- function's result, CURRENT_DATE), or it calls a function that is not immutable (to_char of a
-- timestamptz reads TimeZone, of a number lc_numeric), but for `text || value`, whose text is its
-- value's, and auth.uid/jwt/role. Built-in functions and types are in no pg_depend entry (they are
-- pinned), so the tree itself is read. Errs towards true.
create or replace function kizuna.tree_follows_settings(tree text) returns boolean language sql stable as $$
  select exists (select 1 from regexp_matches(tree,
                   ':(?:vartype|consttype|funcresulttype|opresulttype|resulttype|casetype|coalescetype|minmaxtype|array_typeid|row_typeid|type) (\d+)', 'g') m
                  where kizuna.type_follows_settings(m[1]::oid))
      or exists (select 1 from regexp_matches(tree, ':(?:funcid|opfuncid) (\d+)', 'g') m
                  where m[1]::oid not in ('pg_catalog.textanycat'::regproc, 'pg_catalog.anytextcat'::regproc)
                    and not kizuna.is_pure_function(m[1]::oid))
$$;
