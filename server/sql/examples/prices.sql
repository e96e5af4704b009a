-- An example synced table keyed by a number whose equality is coarser than its text: `numeric`
-- holds 7.0 and 7.00 as one key, and the server names the key as its row spells it, so a device
-- that writes another spelling learns the row's from the verdict. Used by the browser tests; run it
-- after the pack. Idempotent; keep its shape stable.

create table if not exists public.prices (
  id numeric primary key,
  owner uuid not null default auth.uid(),
  label text not null default ''
);

alter table public.prices enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'prices' and policyname = 'prices_own') then
    create policy prices_own on public.prices for all
      using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
  end if;
end
$$;

grant select, insert, update, delete on public.prices to authenticated;

select kizuna.register_table('public.prices', bucket => $$'user:' || owner$$);
