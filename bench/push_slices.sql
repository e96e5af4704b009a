-- push.sql_ratio: 10,000 queued writes pushed as the client sends them (slices of the client's
-- default maxSlice, 256, or of `bench.slice` when set: PGOPTIONS="-c bench.slice=64"; each request
-- its own transaction, as the gateway runs it) against one plain INSERT of the same rows by the same
-- caller into the same synced table: the limit for getting these rows synced, since a plain SQL
-- writer pays the capture trigger and the commit fence too. push.sql_unsynced_ratio: against the
-- same INSERT into an equivalent table that is not synced (same columns, defaults and policies),
-- which does not number or log anything. Each limit is measured before and after the push; the
-- smaller (harder) one is used. Timed inside the database, commits included.
-- Prints one NOTICE line: `push.sql <json>`, which scripts/bench.sh hands to the browser report.
drop table if exists public.bench_todos_plain;
create table public.bench_todos_plain (like public.todos including defaults including constraints);
alter table public.bench_todos_plain add primary key (id);
alter table public.bench_todos_plain enable row level security;
create policy own on public.bench_todos_plain using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
grant select, insert, update, delete on public.bench_todos_plain to authenticated;

do $$
declare
  n constant integer := 10000;
  slice constant integer := coalesce(nullif(current_setting('bench.slice', true), '')::integer, 256);
  who text := gen_random_uuid()::text;
  client uuid := gen_random_uuid();
  -- The rows the browser bench writes (bench/browser/bench.js, row(i)), under keys of this run.
  rows_ jsonb := (select jsonb_agg(jsonb_build_object('id', who || '-r' || g, 'title', 'row number ' || g || ' with some words in it',
                                                      'done', g % 2 = 0, 'position', g) order by g)
                    from generate_series(0, n - 1) g);
  requests jsonb[];
  answer jsonb;
  applied bigint := 0;
  started timestamptz;
  push_ms numeric;
  plain_ms numeric[] := '{}';
  synced_ms numeric[] := '{}';
  i integer;
begin
  -- Mutations as the client sends them: upserts of whole rows, read_seq 0, an hlc, rising client_seq.
  requests := array(
    select jsonb_build_object('protocol', 1, 'client_id', client, 'mutations',
             jsonb_agg(jsonb_build_object('id', gen_random_uuid(), 'client_seq', o, 'table', 'todos', 'pk', r ->> 'id',
                                          'op', 'upsert', 'columns', r, 'read_seq', 0,
                                          'hlc', (1700000000000 + o) || '-0000-bench') order by o))
      from jsonb_array_elements(rows_) with ordinality a(r, o)
     group by (o - 1) / slice order by (o - 1) / slice);
  commit;

  for i in 1 .. 2 loop
    if i = 2 then
      started := clock_timestamp();
      foreach answer in array requests loop
        perform set_config('role', 'authenticated', true);
        perform set_config('request.jwt.claims', jsonb_build_object('sub', who, 'role', 'authenticated')::text, true);
        answer := public.kizuna_push(answer);
        applied := applied + (select count(*) from jsonb_array_elements(answer -> 'verdicts') v where v ->> 'status' = 'APPLIED');
        commit;
      end loop;
      push_ms := extract(epoch from clock_timestamp() - started) * 1000;
    end if;
    perform set_config('role', 'authenticated', true);
    perform set_config('request.jwt.claims', jsonb_build_object('sub', who, 'role', 'authenticated')::text, true);
    started := clock_timestamp();
    insert into public.todos (id, title, done, position)
    select id || '-sql' || i, title, done, position from jsonb_populate_recordset(null::public.todos, rows_);
    commit;
    synced_ms := synced_ms || extract(epoch from clock_timestamp() - started) * 1000;
    perform set_config('role', 'authenticated', true);
    perform set_config('request.jwt.claims', jsonb_build_object('sub', who, 'role', 'authenticated')::text, true);
    started := clock_timestamp();
    insert into public.bench_todos_plain (id, title, done, position)
    select id || '-' || i, title, done, position from jsonb_populate_recordset(null::public.bench_todos_plain, rows_);
    commit;
    plain_ms := plain_ms || extract(epoch from clock_timestamp() - started) * 1000;
  end loop;

  if applied <> n then
    raise exception 'push.sql: % of % writes applied', applied, n;
  end if;
  raise notice 'push.sql %', jsonb_build_object(
    'writes', n, 'slice', slice, 'requests', array_length(requests, 1),
    'kizuna_push_ms', round(push_ms), 'per_write_ms', round(push_ms / n, 3),
    'synced_insert_ms', round((select min(x) from unnest(synced_ms) x)),
    'synced_insert_runs_ms', (select jsonb_agg(round(x)) from unnest(synced_ms) x),
    'unsynced_insert_ms', round((select min(x) from unnest(plain_ms) x)),
    'unsynced_insert_runs_ms', (select jsonb_agg(round(x)) from unnest(plain_ms) x),
    'sql_ratio', round(push_ms / (select min(x) from unnest(synced_ms) x), 2),
    'sql_unsynced_ratio', round(push_ms / (select min(x) from unnest(plain_ms) x), 2));
end
$$;
drop table public.bench_todos_plain;
