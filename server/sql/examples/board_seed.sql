-- The demo board's cards: a few per list, and an archive of :archive_cards cards (a psql
-- variable: `psql -v archive_cards=30000 -f board_seed.sql`) that a device pulls only when it
-- joins the archive, for a large first sync with a progress bar. Loaded as the superuser (row
-- security does not apply); the change triggers number every row like any other write.
-- Idempotent: cards that exist are left as they are.
insert into public.board_cards (id, list, title, notes, assignee, done, position) values
  ('launch-1', 'launch', 'Pick the launch date', 'Before the press kit goes out.', 'alice', false, 1),
  ('launch-2', 'launch', 'Write the changelog', null, 'bob', false, 2),
  ('launch-3', 'launch', 'Book the demo room', 'Third floor, with a projector.', 'carol', true, 3),
  ('design-1', 'design', 'Draw the onboarding screens', null, 'bob', false, 1),
  ('design-2', 'design', 'Choose the icon set', 'Line icons, not filled.', 'alice', false, 2),
  ('ops-1', 'ops', 'Rotate the database password', null, 'carol', false, 1),
  ('ops-2', 'ops', 'Set up the status page', null, 'alice', false, 2)
on conflict (id) do nothing;

insert into public.board_cards (id, list, title, notes, assignee, done, position)
select 'archive-' || lpad(g::text, 6, '0'), 'archive', 'Archived card ' || g, null,
       (array['alice', 'bob', 'carol'])[1 + g % 3], true, g
  from generate_series(1, :archive_cards) g
on conflict (id) do nothing;
