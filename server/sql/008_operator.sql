-- Kizuna SQL pack, file 9 of 10: the operator's RPC.
--
-- public.kizuna_admin(request jsonb) lets a service_role caller run maintenance without a database
-- login: through the gateway (`POST /rest/v1/rpc/kizuna_admin`) or a hosted project's PostgREST.
-- Only service_role may execute it (and the owner); anon and authenticated get 42501.
--   {"action": "status"}                                   the durable figures of kizuna.status()
--   {"action": "reap"}                                     run the reaper now with the settings
--   {"action": "reap", "tombstone_retention_seconds": 0,   ... or with shorter retention, e.g. to
--                      "ledger_retention_seconds": 3600}       expire old checkpoints at once
--   {"action": "new_epoch"}                                start a new server history (after restoring
--                                                          a backup in place): every cursor answers
--                                                          SERVER_RESET and clients rehydrate
create or replace function kizuna.seconds_arg(request jsonb, field text) returns interval
language plpgsql immutable as $$
begin
  if not request ? field then
    return null;
  end if;
  if jsonb_typeof(request -> field) <> 'number' or (request ->> field)::numeric < 0 then
    perform kizuna.fail('KZP01', field || ' must be a number of seconds, zero or more');
  end if;
  return make_interval(secs => (request ->> field)::double precision);
end
$$;

create or replace function public.kizuna_admin(request jsonb) returns jsonb
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  if jsonb_typeof(request) is distinct from 'object' then
    perform kizuna.fail('KZP01', 'the request must be an object with an action');
  end if;
  case request ->> 'action'
    when 'status' then
      return kizuna.status();
    when 'reap' then
      return kizuna.reap(kizuna.seconds_arg(request, 'tombstone_retention_seconds'),
                         kizuna.seconds_arg(request, 'ledger_retention_seconds'));
    when 'new_epoch' then
      return jsonb_build_object('epoch', kizuna.new_epoch());
    else
      perform kizuna.fail('KZP01', 'unknown action', null, 'use "status", "reap" or "new_epoch"');
  end case;
  return null;
end
$$;

revoke all on function public.kizuna_admin(jsonb) from public;
revoke all on function kizuna.seconds_arg(jsonb, text) from public, anon, authenticated;
grant execute on function public.kizuna_admin(jsonb) to service_role;
