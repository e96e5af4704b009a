-- One full pull run of the 100,000-row bulk user, in pages of :limit, timed inside the database.
do $$
declare
  cur text;
  page jsonb;
  pages int := 0;
  entries bigint := 0;
  started timestamptz := clock_timestamp();
begin
  perform set_config('role', 'authenticated', true);
  perform set_config('request.jwt.claims', '{"sub": "00000000-0000-4000-8000-000000000100", "role": "authenticated"}', true);
  loop
    page := public.kizuna_pull(jsonb_build_object('protocol', 1, 'client_id', '00000000-0000-4000-8000-0000000000b1',
      'cursor', cur, 'buckets', jsonb_build_array('user:00000000-0000-4000-8000-000000000100'),
      'limit', current_setting('bench.limit')::int));
    pages := pages + 1;
    entries := entries + jsonb_array_length(page -> 'entries');
    cur := page ->> 'cursor';
    exit when (page ->> 'done')::boolean;
  end loop;
  raise notice 'pull, pages of %: % entries in % pages, % ms', current_setting('bench.limit'), entries, pages,
    round(extract(epoch from clock_timestamp() - started) * 1000);
end
$$;
