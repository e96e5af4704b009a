-- 1,000,000 rows owned by one user, for make bench's memory figure: a first sync of them runs in
-- the same wasm memory as one of 100,000 (tests/fixtures/bulk.sql).
insert into public.todos (id, owner, title, done, position)
select 'm-' || lpad(g::text, 7, '0'), '00000000-0000-4000-8000-000000000101', 'million row ' || g, g % 2 = 0, g
from generate_series(1, 1000000) g
on conflict (id) do nothing;
