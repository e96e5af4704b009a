-- A board's cards, one bucket per list: moving a card to another list moves it to another bucket.
-- Used by the browser tests (rows moving between buckets, bucket-set changes). Idempotent; run it
-- after the pack. Each user's cards are their own (the policy); list ids are the app's (uuids).

create table if not exists public.cards (
  id text primary key,
  owner uuid not null default auth.uid(),
  list text not null,
  title text not null default '',
  notes text,
  assignee text,
  done boolean not null default false,
  position double precision
);

alter table public.cards enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'cards' and policyname = 'cards_own') then
    create policy cards_own on public.cards using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
  end if;
end
$$;

grant select, insert, update, delete on public.cards to authenticated;

select kizuna.register_table('public.cards', bucket => $$'list:' || list$$, conflict_mode => 'arrival');
