-- Kizuna SQL pack, file 7 of 10: pull.
--
-- Cursor grammar, version 1 (opaque to clients; only this file parses it):
--
--   cursor     = checkpoint | position | sealed
--   checkpoint = "kz1." epoch "." from                       ; a run ended here: the next run starts after `from`
--   position   = "kz1." epoch "." from "." start "." seq "." hex(table) "." hex(pk) "." hex(bucket)
--                                                            ; inside a run: resume after this entry
--   sealed     = "kz1." epoch "." from "." start ".x" hex(nonce) "." hex(box)
--                                                            ; resume after an entry the caller may not see
--   box        = the bytes of seq "." hex(table) "." hex(pk) "." hex(bucket), XORed with a keystream of
--                sha256(kizuna.state.cursor_key || nonce || int4 block number) blocks; nonce: 16 random bytes
--   epoch      = 16 lowercase hex digits                      ; kizuna.state.epoch of the server that issued it
--   from, start, seq = decimal digits
--   hex(x)     = lowercase hex of x's UTF-8 bytes (possibly empty)
--
-- A run starts from null (from = 0) or from a checkpoint; every position cursor carries that `from`
-- and the run's `start` (the horizon of its first page). Each page reads entries `position < (seq, table, pk,
-- bucket) <= horizon`, bytewise, where horizon is the largest commit number visible to the page's
-- own snapshot (kizuna.horizon(), which the fence keeps): the horizon advances from page to page.
-- The page that reaches the end has done: true and the checkpoint cursor "kz1.<epoch>.<horizon>".
--
-- Snapshots. The change log keeps one entry per (table, key, bucket), so a commit during a run
-- moves a key's entry up to the commit's number. With a horizon fixed at the run's start, an entry
-- not yet paged that moved above it would drop out of the run, and the checkpoint would show the
-- rows written after it without it. With the advancing horizon, a moved entry's new number is
-- above every horizon served so far, so it is still ahead of the position and is delivered in its
-- new state; every key's last delivery is its state at the closing page's horizon, and the
-- committed checkpoint equals the server's state at that horizon. This needs each page to read
-- one snapshot (its horizon and its rows alike): the gateway runs pulls at REPEATABLE READ, and the
-- function asks PostgREST for it (default_transaction_isolation, 007). The cost: a run ends when
-- it catches up with the writes landing in its buckets, so under writes faster than the pull
-- itself it goes on (each page still commits nothing on the client until the closing one).
--
-- Lifecycle signals (answered with no entries, done: true, cursor "kz1.<epoch>.0"):
--   CHECKPOINT_EXPIRED  from > 0 and from < kizuna.state.low_watermark (a tombstone after `from` was
--                       pruned), judged on every page of the run, before and again after the page
--                       is collected; a run from null always completes.
--   SERVER_RESET        the cursor names another epoch (the database was reset, restored or copied,
--                       or kizuna.new_epoch() was called) or a position beyond this server's history.
-- Either way the client discards its local snapshot and pulls again from null.
--
-- Rows are rendered through the caller's SELECT policy (invisible ones are skipped, the cursor still
-- moves past them). Tombstones go to runs from a checkpoint, and to a run from null only for the
-- deletes committed after its first page (its horizon advances, so it may have delivered the row
-- already; at its first horizon it has nothing to delete), and only when the caller's SELECT policy
-- renders the image the row left with.
--
-- Cost per request. A page examines at most kizuna.pull_budget(limit) candidate entries, rendered
-- a chunk at a time through the table's primary-key index, whatever the caller may see: a page
-- over entries the caller may not see ends early with fewer entries (possibly none), done: false,
-- and a sealed cursor, so the pull costs what it returns plus a bounded amount, and its time says
-- nothing about how large a hidden bucket is. The sealed cursor names the position without
-- revealing the key, table or sequence number of an entry the caller may not see (it is sealed for
-- confidentiality only: a forged one can only skip or repeat entries the caller could see anyway).
-- What a stranger can still count is the number of such pages a run over a hidden bucket takes,
-- about one per pull_budget hidden entries: bucket names that carry a secret (a uuid) close that.
-- The exception is a run's first page, which also counts the run for its `total` (kizuna.run_total):
-- one pass over at most 200 pages of its limit (and max_progress_count) entries, whatever the
-- caller may see, so its time does grow with a hidden bucket, up to that cap (max_progress_count = 0
-- turns the count off).

create or replace function kizuna.hex(t text) returns text language sql immutable as
  $$ select encode(convert_to(t, 'UTF8'), 'hex') $$;

create or replace function kizuna.unhex(h text) returns text language sql immutable as
  $$ select convert_from(decode(h, 'hex'), 'UTF8') $$;

-- Candidate entries one request may examine: twice the page plus its look-ahead, and at least 32,
-- so that a stranger's page costs about what an owner's does. The first chunk is the page and its
-- look-ahead (all an owner needs), at least 32: small pages then take one round of statements,
-- whoever asks; the rest of the budget, when needed, is the second.
create or replace function kizuna.pull_budget(lim integer) returns integer language sql immutable as
  $$ select greatest(2 * (lim + 1), 32) $$;
create or replace function kizuna.pull_first_chunk(lim integer) returns integer language sql immutable as
  $$ select greatest(lim + 1, 32) $$;

create or replace function kizuna.keystream(nonce bytea, n integer) returns bytea
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select coalesce(string_agg(sha256(s.cursor_key || nonce || int4send(b)), ''::bytea order by b), ''::bytea)
    from kizuna.state s, generate_series(0, (n + 31) / 32 - 1) b
$$;

create or replace function kizuna.xor_bytes(a bytea, k bytea) returns bytea language sql immutable as $$
  select coalesce(decode(string_agg(lpad(to_hex(get_byte(a, i) # get_byte(k, i)), 2, '0'), '' order by i), 'hex'),
                  ''::bytea)
    from generate_series(0, length(a) - 1) i
$$;

-- The sealed part of a cursor for a position the caller may not be shown; see the grammar above.
create or replace function kizuna.seal(spot text) returns text language plpgsql volatile as $$
declare
  nonce bytea := decode(replace(gen_random_uuid()::text, '-', ''), 'hex');
  plain bytea := convert_to(spot, 'UTF8');
begin
  return 'x' || encode(nonce, 'hex') || '.' || encode(kizuna.xor_bytes(plain, kizuna.keystream(nonce, length(plain))), 'hex');
end
$$;

-- The position inside a sealed part, or null when it does not open.
create or replace function kizuna.unseal(nonce_part text, box_part text) returns text language plpgsql stable as $$
declare
  nonce bytea;
  box bytea;
begin
  if nonce_part !~ '^x[0-9a-f]{32}$' or box_part !~ '^([0-9a-f]{2})+$' or length(box_part) > 8192 then
    return null;
  end if;
  nonce := decode(substr(nonce_part, 2), 'hex');
  box := decode(box_part, 'hex');
  return convert_from(kizuna.xor_bytes(box, kizuna.keystream(nonce, length(box))), 'UTF8');
exception when others then
  return null;
end
$$;

create or replace function kizuna.pull_state(out epoch text, out horizon bigint, out low_watermark bigint)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
begin
  select s.epoch, kizuna.horizon(), s.low_watermark into epoch, horizon, low_watermark from kizuna.state s;
end
$$;

-- The next candidate entries of a run, in order, from the requested buckets (rows not yet rendered).
drop function if exists kizuna.page_candidates(text[], bigint, boolean, bigint, text, text, text, integer);
-- tombstones_after: tombstones with a greater seq are candidates (see kizuna_pull: a run from a
-- checkpoint gets every one after it, a run from null those its own pages may have outrun).
create or replace function kizuna.page_candidates(buckets text[], horizon bigint, tombstones_after bigint,
                                                  after_seq bigint, after_tbl text, after_pk text,
                                                  after_bucket text, n integer)
returns setof kizuna.changes language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
-- Each bucket is read in the index's order and only as far as the page needs. Without bitmap
-- scans the planner has no cheaper-looking way: while the statistics still counted few rows of a
-- bucket (a freshly loaded table, before autovacuum analyzed it), it read the whole bucket
-- through a bitmap and sorted it, for every page.
set enable_bitmapscan = off as $$
begin
  -- PL/pgSQL, not SQL: its plan is kept across calls (a SQL function is planned at every call).
  return query
  select c.*
    from (select distinct b from unnest(buckets) b) rb
   cross join lateral (
     select * from kizuna.changes c
      where c.bucket = rb.b and c.seq <= horizon and (not c.deleted or c.seq > tombstones_after)
        and (c.seq, c.tbl, c.pk) >= (after_seq, after_tbl, after_pk)
      order by c.seq, c.tbl, c.pk
      limit n + 1) c
   where (c.seq, c.tbl, c.pk, c.bucket) > (after_seq, after_tbl, after_pk, after_bucket)
   order by c.seq, c.tbl, c.pk, c.bucket
   limit n;
end
$$;

-- The change-log entries of a run, from the requested buckets, up to `cap + 1` of them, read
-- through changes_bucket_seq (one index range per bucket): what the run's total is counted over.
-- Only what the count needs: the key, and a tombstone's image (a live row's is not kept).
drop function if exists kizuna.run_candidates(text[], bigint, bigint, integer);
create or replace function kizuna.run_keys(buckets text[], run_from bigint, horizon bigint, cap integer,
                                           out tbl text, out pk text, out deleted boolean, out image jsonb)
returns setof record language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select c.tbl, c.pk, c.deleted, c.image
    from (select distinct b from unnest(buckets) b) rb
   cross join lateral (
     select c.tbl, c.pk, c.deleted, case when c.deleted then c.image end as image
       from kizuna.changes c
      where c.bucket = rb.b and c.seq > run_from and c.seq <= horizon and (run_from > 0 or not c.deleted)
      limit cap + 1) c
   limit cap + 1
$$;

-- The number of entries a run from `run_from` will deliver up to `horizon`, counted as the caller:
-- live rows through the table's SELECT policy (keys as one array parameter, as render_entries
-- reads them), tombstones through their image. Null past 200 pages of the request's `lim` (so
-- the count costs at most a bounded multiple of what the request asked for) or past
-- `max_progress_count` entries, or when that setting is 0. The first page of a run carries it as
-- `total`; the horizon advances with the run, so a run may deliver more (or fewer) than counted.
drop function if exists kizuna.run_total(text[], bigint, bigint);
create or replace function kizuna.run_total(buckets text[], run_from bigint, horizon bigint, lim integer) returns bigint
language plpgsql stable as $$
declare
  cap integer := least((select max_progress_count from kizuna.settings), 200::bigint * lim)::integer;
  g record;
  t kizuna.synced_tables;
  total bigint := 0;
  n bigint;
begin
  if cap <= 0 then
    return null;
  end if;
  -- One pass over at most cap + 1 entries, grouped by table; `all_n` (over every group) is known
  -- with the first group, so a run past the cap is not counted any further.
  for g in select k.tbl, sum(count(*)) over () as all_n,
                  array_agg(k.pk) filter (where not k.deleted) as live,
                  array_agg(k.image) filter (where k.deleted) as images
             from kizuna.run_keys(buckets, run_from, horizon, cap) k
            group by k.tbl loop
    if g.all_n > cap then
      return null;
    end if;
    select s.* into t from kizuna.synced_tables s where s.name = g.tbl;
    if t.name is null or not coalesce(has_table_privilege(t.rel, 'SELECT'), false) then
      continue;  -- no privilege (or no table: dropped): nothing is visible
    end if;
    if g.live is not null then
      execute format('select count(*) from unnest(cast($1 as %3$s[])) as k(pk) join %1$s r on r.%2$I = k.pk',
                     t.rel, t.pk_column, kizuna.key_type_of(t))
        into n using g.live;
      total := total + n;
    end if;
    if g.images is not null then
      total := total + (select count(*) from kizuna.visible_images(t.rel, g.images));
    end if;
  end loop;
  return total;
end
$$;

-- Records that a run was served to completion for these buckets (the DELETE_WINS rule in 005).
-- A poll that finds nothing new (served_to already at the horizon) writes nothing: the upsert
-- would rewrite the row, and lock it even with a WHERE that leaves it be, so every idle poll of
-- every client paid a new row version and a WAL flush at its commit.
create or replace function kizuna.record_served(client uuid, buckets text[], run_from bigint, horizon bigint)
returns void language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  perform kizuna.check_own_client(client);
  if not exists (select 1 from unnest(buckets) b
                  where not exists (select 1 from kizuna.client_buckets cb
                                     where cb.client_id = client and cb.bucket = b
                                       and cb.served_to >= horizon and (run_from <> 0 or cb.joined = 0))) then
    return;
  end if;
  insert into kizuna.client_buckets as cb (client_id, bucket, joined, served_to)
  select client, b, run_from, horizon from (select distinct b from unnest(buckets) b) d
  on conflict (client_id, bucket) do update
    set joined = case when excluded.joined = 0 then 0 else cb.joined end,
        served_to = greatest(cb.served_to, excluded.served_to);
end
$$;

-- The caller's conflict-journal entries recorded in (run_from, horizon], for the closing page of a
-- run from a checkpoint.
drop function if exists kizuna.conflicts_for(text, bigint, bigint);
create or replace function kizuna.conflicts_for(run_from bigint, horizon bigint) returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
           'table', c.tbl, 'pk', c.pk, 'column', c.col, 'loser_seq', c.loser_seq, 'winner_seq', c.winner_seq,
           'loser_by', c.loser_by)) || jsonb_build_object('loser', c.loser, 'winner', c.winner)
         order by c.recorded_seq, c.id)
    from kizuna.conflicts c
   where c.recorded_seq > run_from and c.recorded_seq <= horizon
     and kizuna.caller() in (c.loser_by, c.winner_by)
$$;

-- Renders candidate entries as the caller: the visible ones as wire entries, in order, of the first
-- `determined` candidates, whose rows take about `budget` bytes (the jsonb size of each row) or
-- less, `bytes` of them. At least the first candidate is always determined (a row larger than the
-- budget alone is still delivered, alone), so every page moves on; the candidates after
-- `determined` were not read, and the page ends before them. Without the budget a page of large
-- rows (5,000 of 60 KB, each under max_row_bytes) failed every time at jsonb's 256 MB limit.
-- Entries are filled into a pre-sized array by position and aggregated once: appending to a jsonb
-- array copies it, which made a 5000-entry page quadratic (30 s instead of well under one).
drop function if exists kizuna.render_entries(kizuna.changes[]);
create or replace function kizuna.render_entries(candidates kizuna.changes[], budget bigint,
                                                 out entries jsonb, out determined integer, out bytes bigint)
language plpgsql stable as $$
declare
  n integer := coalesce(cardinality(candidates), 0);
  rendered jsonb[];
  keys text[];
  positions integer[];
  t kizuna.synced_tables;
  live record;
  c kizuna.changes;
  sizes bigint[];
  used bigint;
  size bigint;
  ordered boolean;
  over boolean := false;
begin
  -- Live rows, one query per table, through the caller's SELECT policy. The keys go in as arrays
  -- so the table is read through its primary key, not scanned (which also evaluated the policy on
  -- every row of the table, once per page). A first pass reads the rows in any order and stops
  -- once they pass the budget; when none does (pages of rows of common sizes), it is the only one.
  -- Otherwise a second pass reads the tables in the order of their first candidate and each one's
  -- rows in candidate order (a sort that made every page 5 - 10 % slower, so paid only here): a
  -- table's rows before the first one past the budget were all read (those the query did not
  -- return are hidden from the caller), and the first candidate is always read.
  foreach ordered in array array[false, true] loop
    determined := n;
    rendered := array_fill(null::jsonb, array[n]);
    sizes := case when ordered then array_fill(0::bigint, array[n]) end;
    used := 0;
    for t in select s.* from kizuna.synced_tables s
               join (select x.tbl, min(x.ordinality) as first from unnest(candidates) with ordinality x
                      where not x.deleted group by x.tbl) f on f.tbl = s.name
              where has_table_privilege(s.rel, 'SELECT')  -- no privilege: nothing is visible
              order by f.first loop
      keys := '{}';
      positions := '{}';
      for i in 1 .. determined loop
        c := candidates[i];
        if c.tbl = t.name and not c.deleted then
          keys := keys || c.pk;
          positions := positions || i;
        end if;
      end loop;
      continue when cardinality(keys) = 0;
      -- The keys are cast as one array parameter, not per row in the join: a cast over a column of
      -- the join is not leakproof, so behind the table's security barrier it could not be an index
      -- condition, and each chunk read the whole table under the policy instead.
      -- One index lookup per key (the subquery's limit keeps it apart from the join): as a join,
      -- a plan made while the table's statistics counted few rows (before autovacuum analyzed a
      -- freshly loaded table) read the whole table for every page.
      for live in execute format(
          'select k.i, r.row
             from unnest(cast($1 as %3$s[]), $2::integer[]) with ordinality as k(pk, i, o)
             cross join lateral (select to_jsonb(r) as row from %1$s r where r.%2$I = k.pk limit 1) r'
          || case when ordered then ' order by k.o' else '' end,
          t.rel, t.pk_column, kizuna.key_type_of(t))
        using keys, positions loop
        exit when live.i > determined;  -- past where an earlier table's rows reached the budget
        size := pg_column_size(live.row);
        if used > 0 and used + size > budget then
          over := true;
          determined := live.i - 1;
          exit;
        end if;
        used := used + size;
        if ordered then
          sizes[live.i] := size;
        end if;
        c := candidates[live.i];
        rendered[live.i] := jsonb_build_object('seq', c.seq, 'table', c.tbl, 'pk', c.pk,
                                               'bucket', c.bucket, 'row', live.row);
      end loop;
      exit when over and not ordered;
    end loop;
    exit when not over or ordered;
  end loop;

  -- Tombstones, through the caller's SELECT policy over the images they keep, a table at a time.
  for t in select s.* from kizuna.synced_tables s
            where s.name in (select candidates[i].tbl from generate_subscripts(candidates, 1) i
                              where i <= determined and candidates[i].deleted) loop
    positions := array(select i from generate_subscripts(candidates, 1) i
                        where i <= determined and candidates[i].deleted and candidates[i].tbl = t.name order by i);
    for live in select positions[v] as i
                  from kizuna.visible_images(t.rel, array(select candidates[p].image from unnest(positions) with ordinality u(p, o) order by o)) v loop
      c := candidates[live.i];
      rendered[live.i] := jsonb_build_object('seq', c.seq, 'table', c.tbl, 'pk', c.pk,
                                             'bucket', c.bucket, 'deleted', true);
    end loop;
  end loop;
  entries := (select coalesce(jsonb_agg(e order by i), '[]'::jsonb)
                from unnest(rendered) with ordinality u(e, i) where e is not null and i <= determined);
  bytes := case when over then (select sum(z) from unnest(sizes) with ordinality u(z, i) where i <= determined) else used end;
end
$$;

create or replace function kizuna.lifecycle_page(signal text) returns jsonb
language sql stable as $$
  select jsonb_build_object('entries', '[]'::jsonb, 'cursor', 'kz1.' || s.epoch || '.0', 'done', true,
                            'horizon', s.horizon, 'lifecycle', signal)
    from kizuna.pull_state() s
$$;

create or replace function public.kizuna_pull(request jsonb) returns jsonb
language plpgsql set search_path = pg_catalog, public, pg_temp as $$
declare
  st record;
  c kizuna.clients;
  buckets text[];
  lim integer;
  cur text;
  parts text[];
  run_from bigint;
  run_start bigint;  -- the horizon of the run's first page, carried by its cursors
  horizon bigint;
  pos_seq bigint;
  pos_tbl text := '';
  pos_pk text := '';
  pos_bucket text := '';
  batch kizuna.changes[];
  part record;
  entries jsonb := '[]';
  used_bytes bigint := 0;
  page_bytes bigint := (select max_page_bytes from kizuna.settings);
  last_of_page jsonb;
  page jsonb;
  conflicts jsonb;
  chunk integer;
  examined integer := 0;
  first_page boolean := false;
  counted jsonb := '{}';
  ends_early boolean := false;  -- out of the candidate budget, or the page is full by bytes
begin
  perform kizuna.check_envelope(request);
  if coalesce(jsonb_typeof(request -> 'cursor'), 'null') not in ('null', 'string') then
    perform kizuna.fail('KZP01', 'cursor must be a string or null');
  end if;
  if jsonb_typeof(request -> 'buckets') is distinct from 'array'
     or exists (select 1 from jsonb_array_elements(request -> 'buckets') b where jsonb_typeof(b) <> 'string') then
    perform kizuna.fail('KZP01', 'buckets must be an array of strings');
  end if;
  if not kizuna.is_int(request -> 'limit') or (request ->> 'limit')::bigint < 1 then
    perform kizuna.fail('KZP01', 'limit must be a positive integer');
  end if;
  if jsonb_array_length(request -> 'buckets') > (select max_pull_buckets from kizuna.settings) then
    perform kizuna.fail('KZP01', format('%s buckets exceed max_pull_buckets %s', jsonb_array_length(request -> 'buckets'),
                                        (select max_pull_buckets from kizuna.settings)));
  end if;
  buckets := array(select jsonb_array_elements_text(request -> 'buckets'));
  lim := least((request ->> 'limit')::bigint, (select max_pull_limit from kizuna.settings));
  c := kizuna.touch_client((request ->> 'client_id')::uuid, false);
  st := kizuna.pull_state();

  -- The cursor: where this page starts, and the run's starting checkpoint and horizon.
  cur := request ->> 'cursor';
  if cur is null then
    run_from := 0;
    horizon := st.horizon;
    run_start := horizon;
    pos_seq := 1;
    first_page := true;
  else
    parts := string_to_array(cur, '.');
    if cardinality(parts) = 6 and parts[2] = st.epoch then
      -- Sealed: open it into the position form (only this server's epoch holds the key).
      parts := parts[1:4] || string_to_array(coalesce(kizuna.unseal(parts[5], parts[6]), '!'), '.');
    end if;
    if parts[1] <> 'kz1' or parts[2] !~ '^[0-9a-f]{16}$'
       or cardinality(parts) not in (3, 6, 8)
       or (cardinality(parts) = 6 and parts[2] = st.epoch)
       or exists (select 1 from unnest(parts[3:4]) p where p !~ '^[0-9]{1,18}$')
       or (cardinality(parts) = 8 and parts[5] !~ '^[0-9]{1,18}$')
       or exists (select 1 from unnest(parts[6:8]) p where p !~ '^([0-9a-f]{2})*$') then
      perform kizuna.fail('KZP01', 'unparseable cursor', null, 'send a cursor this server issued, or null');
    end if;
    if parts[2] <> st.epoch then
      return kizuna.lifecycle_page('SERVER_RESET');
    end if;
    run_from := parts[3]::bigint;
    if cardinality(parts) = 3 then
      horizon := st.horizon;
      run_start := horizon;
      pos_seq := run_from + 1;  -- with empty names: every entry with seq > run_from
      first_page := true;
    else
      run_start := parts[4]::bigint;
      pos_seq := parts[5]::bigint;
      begin
        pos_tbl := kizuna.unhex(parts[6]);
        pos_pk := kizuna.unhex(parts[7]);
        pos_bucket := kizuna.unhex(parts[8]);
      exception when others then
        perform kizuna.fail('KZP01', 'unparseable cursor', null, 'send a cursor this server issued, or null');
      end;
      if pos_seq < run_from or run_start < run_from then
        perform kizuna.fail('KZP01', 'unparseable cursor', null, 'send a cursor this server issued, or null');
      end if;
      if pos_seq > st.horizon then
        return kizuna.lifecycle_page('SERVER_RESET');  -- a position beyond this database's history
      end if;
    end if;
    if run_from > st.horizon or run_start > st.horizon then
      return kizuna.lifecycle_page('SERVER_RESET');  -- a history this database does not have
    end if;
    -- The horizon advances with the run: this page reads up to the horizon of its own snapshot.
    -- An entry not yet paged that a commit moved up since the last page is then still ahead of
    -- the position (its new seq is above every horizon served so far), so it is delivered, in its
    -- new state; the closing page's horizon is the checkpoint's (see the note at the top).
    horizon := st.horizon;
    if run_from > 0 and run_from < st.low_watermark then
      return kizuna.lifecycle_page('CHECKPOINT_EXPIRED');
    end if;
  end if;

  -- Collect up to lim + 1 visible entries (one look-ahead decides `done`), scanning candidates in
  -- chunks; entries the caller may not see are skipped. At most pull_budget(lim) candidates are
  -- examined: past that the page ends early (see the cost note at the top).
  chunk := kizuna.pull_first_chunk(lim);
  loop
    -- Tombstones: a run from a checkpoint gets every one after it. A run from null has nothing to
    -- delete at its first page's horizon, but its horizon advances with the run: a row one of its
    -- pages delivered and a later commit deleted must go, so it gets the tombstones above that
    -- first horizon (the deletes made while it ran; a key it never delivered ignores them).
    batch := array(select x from kizuna.page_candidates(buckets, horizon, case when run_from > 0 then run_from else run_start end,
                                                        pos_seq, pos_tbl, pos_pk, pos_bucket, chunk) x);
    exit when cardinality(batch) = 0;
    examined := examined + cardinality(batch);
    part := kizuna.render_entries(batch, page_bytes - used_bytes);
    entries := entries || part.entries;
    used_bytes := used_bytes + part.bytes;
    pos_seq := batch[part.determined].seq;
    pos_tbl := batch[part.determined].tbl;
    pos_pk := batch[part.determined].pk;
    pos_bucket := batch[part.determined].bucket;
    if part.determined < cardinality(batch) then
      ends_early := true;  -- the page is full by bytes: it ends after the last candidate read
      exit;
    end if;
    exit when jsonb_array_length(entries) > lim or cardinality(batch) < chunk;
    if examined >= kizuna.pull_budget(lim) or used_bytes >= page_bytes then
      ends_early := true;
      exit;
    end if;
    chunk := kizuna.pull_budget(lim) - examined;
  end loop;

  -- Each statement here reads its own snapshot, so the reaper may have pruned a tombstone of this
  -- run after the check above and before the scan that would have found it. Judge the run again
  -- now that the page is collected: a page never closes a run past a delete it could not see.
  if run_from > 0 and run_from < (select s.low_watermark from kizuna.pull_state() s) then
    return kizuna.lifecycle_page('CHECKPOINT_EXPIRED');
  end if;

  -- The first page of a run says how many entries the run holds. A first page that also closes
  -- the run holds them all, so it says its own length; only a run that goes on is counted
  -- (kizuna.run_total), so an idle poll or a wake-up's pull of a few rows reads its entries once.
  if first_page and (jsonb_array_length(entries) > lim or ends_early) then
    counted := jsonb_build_object('total', kizuna.run_total(buckets, run_from, horizon, lim));
  elsif first_page then
    counted := jsonb_build_object('total', jsonb_array_length(entries));
  end if;
  if jsonb_array_length(entries) > lim then
    entries := (select jsonb_agg(e order by o) from jsonb_array_elements(entries) with ordinality a(e, o) where o <= lim);
    last_of_page := entries -> (lim - 1);
    return jsonb_build_object('entries', entries, 'done', false, 'horizon', horizon,
      'cursor', format('kz1.%s.%s.%s.%s.%s.%s.%s', st.epoch, run_from, run_start, last_of_page ->> 'seq',
                       kizuna.hex(last_of_page ->> 'table'), kizuna.hex(last_of_page ->> 'pk'),
                       kizuna.hex(last_of_page ->> 'bucket'))) || counted;
  end if;
  if ends_early then
    -- Resume after the last candidate read, which the caller may not be allowed to see.
    return jsonb_build_object('entries', entries, 'done', false, 'horizon', horizon,
      'cursor', format('kz1.%s.%s.%s.%s', st.epoch, run_from, run_start,
                       kizuna.seal(format('%s.%s.%s.%s', pos_seq, kizuna.hex(pos_tbl), kizuna.hex(pos_pk),
                                          kizuna.hex(pos_bucket))))) || counted;
  end if;

  perform kizuna.record_served(c.client_id, buckets, run_from, horizon);
  page := jsonb_build_object('entries', entries, 'done', true, 'horizon', horizon,
                             'cursor', format('kz1.%s.%s', st.epoch, horizon)) || counted;
  -- A run from a checkpoint is told of the overwrites since it; one from nothing (a first sync,
  -- a rehydration) showed no earlier value to reconcile, so it is told of none.
  if run_from > 0 and exists (select 1 from kizuna.synced_tables where journal) then
    conflicts := kizuna.conflicts_for(run_from, horizon);
    if conflicts is not null then
      page := page || jsonb_build_object('conflicts', conflicts);
    end if;
  end if;
  return page;
end
$$;
