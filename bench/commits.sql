-- Two tables alike but for registration, to price what fencing adds to a commit.
drop table if exists bench_plain, bench_synced;
create table bench_plain  (id bigserial primary key, bucket text not null, v int);
create table bench_synced (id bigserial primary key, bucket text not null, v int);
select kizuna.register_table('public.bench_synced', bucket => $$'b' || (id % 16)$$);
