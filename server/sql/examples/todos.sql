-- The example synced table used by the demo and the browser tests. Idempotent: run it after the
-- pack (psql -f server/sql/001_core.sql ... -f server/sql/examples/todos.sql). Keep its shape stable.

create table if not exists public.todos (
  id text primary key,
  owner uuid not null default auth.uid(),
  title text not null default '',
  done boolean not null default false,
  note text,
  position double precision,
  updated_at timestamptz not null default now()
);

alter table public.todos enable row level security;

do $$
begin
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'todos' and policyname = 'todos_select_own') then
    create policy todos_select_own on public.todos for select using (owner = (select auth.uid()));
  end if;
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'todos' and policyname = 'todos_insert_own') then
    create policy todos_insert_own on public.todos for insert with check (owner = (select auth.uid()));
  end if;
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'todos' and policyname = 'todos_update_own') then
    create policy todos_update_own on public.todos for update using (owner = (select auth.uid())) with check (owner = (select auth.uid()));
  end if;
  if not exists (select 1 from pg_policies where schemaname = 'public' and tablename = 'todos' and policyname = 'todos_delete_own') then
    create policy todos_delete_own on public.todos for delete using (owner = (select auth.uid()));
  end if;
end
$$;

grant select, insert, update, delete on public.todos to authenticated;

-- The validation gate: a title longer than 200 characters is refused (VALIDATION_FAILED).
create or replace function public.todos_gate(op text, row_ jsonb) returns boolean
language sql immutable as $$
  select op = 'delete' or char_length(coalesce(row_ ->> 'title', '')) <= 200
$$;

-- Each user's todos are their own bucket; columns merge in arrival order.
select kizuna.register_table('public.todos', bucket => $$'user:' || owner$$,
                             conflict_mode => 'arrival', gate => 'public.todos_gate(text, jsonb)');
