-- The demo's team board (www/): lists of cards, one bucket per list, three people who see
-- different lists, a validation gate, a foreign key checked at commit, the conflict journal on.
-- Idempotent: run it after the pack (the gateway does, with --init-sql). Its cards are seeded by
-- examples/board_seed.sql.
--
--   list      members              what it shows
--   launch    Alice, Bob, Carol    the list every device sees: offline edits, conflicts, deletes
--   design    Alice, Bob           a card moved from here to ops leaves Bob's board
--   ops       Alice, Carol         Bob may not write here: RLS_DENIED
--   archive   Alice, Bob, Carol    tens of thousands of cards, pulled only by a device that joins it

-- Who is on the team, by the name a card's assignee holds. Dave has left: he is not here, and a
-- card assigned to him breaks the foreign key below.
create table if not exists public.board_people (
  name text primary key,
  user_id uuid unique
);
insert into public.board_people (name, user_id) values
  ('alice', '11111111-1111-4111-8111-111111111111'),
  ('bob',   '22222222-2222-4222-8222-222222222222'),
  ('carol', '33333333-3333-4333-8333-333333333333')
on conflict (name) do nothing;

-- Which lists each person may see and change; read by the card policies.
create table if not exists public.board_members (
  list text not null,
  user_id uuid not null,
  primary key (list, user_id)
);
insert into public.board_members (list, user_id)
select l.list, p.user_id
  from (values ('launch', 'alice'), ('launch', 'bob'), ('launch', 'carol'),
               ('design', 'alice'), ('design', 'bob'),
               ('ops', 'alice'), ('ops', 'carol'),
               ('archive', 'alice'), ('archive', 'bob'), ('archive', 'carol')) l(list, name)
  join public.board_people p using (name)
on conflict do nothing;
grant select on public.board_people, public.board_members to authenticated;

create table if not exists public.board_cards (
  id text primary key,
  list text not null,
  title text not null default '',
  notes text,
  -- Checked at commit (deferred): a card assigned to someone not on the team fails the whole
  -- request, which the client charges to that write and dead-letters after five refusals.
  assignee text references public.board_people (name) deferrable initially deferred,
  done boolean not null default false,
  position double precision not null default 0,
  -- How many writes the server applied to this card (set by the trigger below, never by a client):
  -- a write delivered twice would count twice.
  revision integer not null default 1
);

create or replace function public.board_count_revision() returns trigger language plpgsql as $$
begin
  new.revision := case when tg_op = 'INSERT' then 1 else old.revision + 1 end;
  return new;
end
$$;
create or replace trigger board_count_revision before insert or update on public.board_cards
  for each row execute function public.board_count_revision();

alter table public.board_cards enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'board_cards' and policyname = 'board_cards_members') then
    -- A member of a card's list may see and change it; moving it to a list is writing to that list.
    create policy board_cards_members on public.board_cards for all
      using (exists (select 1 from public.board_members m where m.list = board_cards.list and m.user_id = (select auth.uid())))
      with check (exists (select 1 from public.board_members m where m.list = board_cards.list and m.user_id = (select auth.uid())));
  end if;
end
$$;

grant select, insert, update, delete on public.board_cards to authenticated;

-- The validation gate: a card's title is 1 to 80 characters (VALIDATION_FAILED otherwise).
create or replace function public.board_gate(op text, row_ jsonb) returns boolean
language sql immutable as $$
  select op = 'delete' or char_length(coalesce(row_ ->> 'title', '')) between 1 and 80
$$;

-- One bucket per list; columns merge in arrival order, and the journal keeps every overwritten
-- value a writer had not seen, so the devices can show which value lost.
select kizuna.register_table('public.board_cards', bucket => $$'board:' || list$$,
                             conflict_mode => 'arrival', journal => true,
                             gate => 'public.board_gate(text, jsonb)');
