-- The source of universe sync's benchmark: :n rows written into a table registered for universe
-- sync, each write appending its event, against the same rows into an unregistered table.
create table bench_items (id bigint primary key, title text, amount numeric, region text);
create table bench_plain (like bench_items including all);
select kizuna.register_universe_table('public.bench_items');
\timing on
\echo '  write' :n 'rows in one INSERT: an unregistered table, then one registered for universe sync (events appended):'
insert into bench_plain select g, 'title ' || g, g * 1.5, 'eu' from generate_series(1, :n) g;
insert into bench_items select g, 'title ' || g, g * 1.5, 'eu' from generate_series(1, :n) g;
