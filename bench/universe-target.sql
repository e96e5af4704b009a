-- The target of universe sync's benchmark: the table the events land in, and an identical one for
-- the INSERT ... SELECT they are measured against. Both synced, so both pay the same capture and
-- fence; the universe one is written by the service identity.
create table if not exists bench_items (id bigint primary key, title text, amount numeric, region text);
create table if not exists bench_items_copy (like bench_items including all);
create table if not exists bench_items_staging (like bench_items including all);
grant select, insert, update, delete on bench_items to service_role;
select kizuna.register_table('public.bench_items', bucket => $$'r:' || region$$);
select kizuna.register_table('public.bench_items_copy', bucket => $$'r:' || region$$);
