-- An example synced table keyed the way most Supabase tables are: `id uuid primary key`. PostgreSQL
-- spells a uuid in lower case only, so a device that writes an upper-case one (Swift's
-- `UUID().uuidString`, an id typed by hand) learns the key's one spelling from the verdict. Used by
-- the browser tests; run it after the pack. Idempotent; keep its shape stable.

create table if not exists public.tags (
  id uuid primary key default gen_random_uuid(),
  owner uuid not null default auth.uid(),
  label text not null default '',
  color text
);

alter table public.tags enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'tags' and policyname = 'tags_own') then
    create policy tags_own on public.tags for all
      using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
  end if;
end
$$;

grant select, insert, update, delete on public.tags to authenticated;

select kizuna.register_table('public.tags', bucket => $$'user:' || owner$$);
