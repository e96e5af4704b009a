-- The history checker's table: rows owned per user, some shared (readable by everyone), one
-- bucket per list so rows move between buckets, a gate that refuses one title, and `n`, which the
-- server counts up on every write it applies: effects are counted, not guessed.
create table if not exists public.hist_items (
  id text primary key,
  owner uuid not null default auth.uid(),
  list text not null,
  shared boolean not null default false,
  a text,
  b text,
  title text,
  n integer not null default 0
);
alter table public.hist_items enable row level security;
do $$
begin
  if not exists (select 1 from pg_policies where tablename = 'hist_items' and policyname = 'hist_read') then
    create policy hist_read on public.hist_items for select using (owner = (select auth.uid()) or shared);
    create policy hist_insert on public.hist_items for insert with check (owner = (select auth.uid()));
    create policy hist_update on public.hist_items for update using (owner = (select auth.uid()))
      with check (owner = (select auth.uid()));
    create policy hist_delete on public.hist_items for delete using (owner = (select auth.uid()));
  end if;
end
$$;
grant select, insert, update, delete on public.hist_items to authenticated;

create or replace function public.hist_count() returns trigger language plpgsql as $$
begin
  new.n := case when tg_op = 'INSERT' then 1 else old.n + 1 end;
  return new;
end
$$;
drop trigger if exists hist_count on public.hist_items;
create trigger hist_count before insert or update on public.hist_items
  for each row execute function public.hist_count();

create or replace function public.hist_gate(op text, row_ jsonb) returns boolean language sql immutable as $$
  select op = 'delete' or coalesce(row_ ->> 'title', '') <> 'refuse-me'
$$;

select kizuna.register_table('public.hist_items', bucket => $$'hl:' || list$$, conflict_mode => 'arrival',
                             gate => 'public.hist_gate(text, jsonb)');
