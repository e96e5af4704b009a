-- The history checker's tables: rows owned per user, some shared (readable by everyone), one
-- bucket per list so rows move between buckets, a gate that refuses one title, and `n`, which the
-- server counts up on every write it applies: effects are counted, not guessed.
create or replace function public.hist_count() returns trigger language plpgsql as $$
begin
  new.n := case when tg_op = 'INSERT' then 1 else old.n + 1 end;
  return new;
end
$$;
create or replace function public.hist_gate(op text, row_ jsonb) returns boolean language sql immutable as $$
  select op = 'delete' or coalesce(row_ ->> 'title', '') <> 'refuse-me'
$$;

-- How each table is registered: here, and again after a history's migration (history.rs).
create or replace function public.hist_register(t regclass) returns void language plpgsql as $$
begin
  perform kizuna.register_table(t, bucket => $b$'hl:' || list$b$,
                                conflict_mode => case (select relname from pg_class where oid = t) when 'hist_notes' then 'hlc' else 'arrival' end,
                                gate => 'public.hist_gate(text, jsonb)');
end
$$;

-- Two tables alike but for their conflict mode: hist_items orders columns by arrival, hist_notes
-- by the writers' hybrid logical clocks.
do $do$
declare
  t record;
begin
  for t in select * from (values ('hist_items'), ('hist_notes')) v(name) loop
    execute format($f$
      create table if not exists public.%1$I (
        id text primary key,
        owner uuid not null default auth.uid(),
        list text not null,
        shared boolean not null default false,
        a text,
        b text,
        x double precision,
        title text,
        n integer not null default 0
      );
      alter table public.%1$I enable row level security;
      grant select, insert, update, delete on public.%1$I to authenticated;
      drop trigger if exists hist_count on public.%1$I;
      create trigger hist_count before insert or update on public.%1$I
        for each row execute function public.hist_count();
    $f$, t.name);
    if not exists (select 1 from pg_policies where tablename = t.name and policyname = 'hist_read') then
      execute format($f$
        create policy hist_read on public.%1$I for select using (owner = (select auth.uid()) or shared);
        create policy hist_insert on public.%1$I for insert with check (owner = (select auth.uid()));
        create policy hist_update on public.%1$I for update using (owner = (select auth.uid()))
          with check (owner = (select auth.uid()));
        create policy hist_delete on public.%1$I for delete using (owner = (select auth.uid()));
      $f$, t.name);
    end if;
    perform public.hist_register(('public.' || t.name)::regclass);
  end loop;
end
$do$;
