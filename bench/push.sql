-- 20 pushes of 500 new rows each by one client, timed inside the database.
do $$
declare
  client uuid := gen_random_uuid();
  who text := gen_random_uuid()::text;
  started timestamptz := clock_timestamp();
  answer jsonb;
  applied bigint := 0;
begin
  perform set_config('role', 'authenticated', true);
  perform set_config('request.jwt.claims', jsonb_build_object('sub', who, 'role', 'authenticated')::text, true);
  for batch in 0 .. 19 loop
    answer := public.kizuna_push(jsonb_build_object('protocol', 1, 'client_id', client, 'mutations',
      (select jsonb_agg(jsonb_build_object('id', gen_random_uuid(), 'client_seq', batch * 500 + g, 'table', 'todos',
                                           'pk', who || '-' || (batch * 500 + g), 'op', 'upsert', 'read_seq', 0,
                                           'columns', jsonb_build_object('id', who || '-' || (batch * 500 + g), 'title', 'row ' || g)))
         from generate_series(1, 500) g)));
    applied := applied + (select count(*) from jsonb_array_elements(answer -> 'verdicts') v where v ->> 'status' = 'APPLIED');
  end loop;
  raise notice 'push, 20 requests of 500 upserts: % applied, % ms, % mutations/s', applied,
    round(extract(epoch from clock_timestamp() - started) * 1000),
    round(applied / extract(epoch from clock_timestamp() - started));
end
$$;
