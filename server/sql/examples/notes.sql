-- A second example synced table: columns ordered by the writers' hybrid logical clocks (hlc mode),
-- with the conflict journal on, so a device learns which of its values lost. Used by the browser
-- tests; run it after the pack, like todos.sql. Idempotent; keep its shape stable.

create table if not exists public.notes (
  id text primary key,
  owner uuid not null default auth.uid(),
  body text not null default '',
  color text
);

alter table public.notes enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'notes' and policyname = 'notes_own') then
    create policy notes_own on public.notes for all
      using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
  end if;
end
$$;

grant select, insert, update, delete on public.notes to authenticated;

select kizuna.register_table('public.notes', bucket => $$'user:' || owner$$,
                             conflict_mode => 'hlc', journal => true);
