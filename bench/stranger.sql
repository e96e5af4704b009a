-- A stranger's pull over a bucket of 10,000 rows it may not see, against the owner's own pull of the
-- same bucket: 200 first pages of limit 1 each, timed inside the database. The ratio is what one
-- request by anyone can cost (issue 9: within 2x).
insert into public.todos (id, owner, title)
select 'hidden-' || g, '00000000-0000-4000-8000-0000000000c0', 'row ' || g from generate_series(1, 10000) g
on conflict do nothing;
do $$
declare
  started timestamptz;
  ms numeric[] := '{}';
  who text;
  request jsonb := jsonb_build_object('protocol', 1, 'cursor', null, 'limit', 1,
    'buckets', jsonb_build_array('user:00000000-0000-4000-8000-0000000000c0'));
  page jsonb;
begin
  foreach who in array array['00000000-0000-4000-8000-0000000000c0', '00000000-0000-4000-8000-0000000000c1'] loop
    perform set_config('role', 'authenticated', true);
    perform set_config('request.jwt.claims', jsonb_build_object('sub', who, 'role', 'authenticated')::text, true);
    page := public.kizuna_pull(request || jsonb_build_object('client_id', md5(who)::uuid));  -- warm up
    started := clock_timestamp();
    for i in 1 .. 200 loop
      page := public.kizuna_pull(request || jsonb_build_object('client_id', md5(who)::uuid));
    end loop;
    ms := ms || round(extract(epoch from clock_timestamp() - started) * 1000 / 200, 3);
    perform set_config('role', 'none', true);
  end loop;
  raise notice 'stranger pull, limit 1 over 10,000 hidden rows: % ms a page; the owner''s: % ms; ratio %',
    ms[2], ms[1], round(ms[2] / nullif(ms[1], 0), 2);
end
$$;
