// A device's feed: what it heard from its client, in words and icons. An entry's text is worked
// out when it is shown, so it names cards by the titles the device knows by then; the same line
// heard again in a row (a retry while offline) is counted, not repeated.
import { count, quote } from "./dom.js";

const LIMIT = 80;

/** Names a card for a feed line: its title, or what the write says, or that it is unknown. */
const card = (titleOf, pk, columns) => quote(titleOf(pk) ?? columns?.title ?? "a card");

function cards(titleOf, keys) {
  const ids = [...new Set(keys.map((k) => k.pk))];
  if (ids.length > 3) return `${count(ids.length)} cards`;
  return ids.map((id) => card(titleOf, id)).join(", ");
}

function writeOf(mutation, titleOf) {
  const what = card(titleOf, mutation.pk, mutation.columns);
  if (mutation.op === "delete") return `delete of ${what}`;
  if (mutation.op === "patch") return `edit of ${what} (${Object.keys(mutation.columns ?? {}).join(", ")})`;
  return `write of ${what}`;
}

const short = (value) => (value === null || value === undefined ? "nothing" : quote(value, 30));

/** The feed line for one event, or null for events the page shows elsewhere. */
function describe(name, e) {
  switch (name) {
    case "change":
      if (e.origin === "local") return { icon: "✎", tone: "local", text: (t) => `Saved on this device: ${cards(t, e.keys)}` };
      if (e.origin === "remote") return { icon: "⬇", tone: "remote", text: (t) => `Pulled: ${cards(t, e.keys)}` };
      return { icon: "↺", tone: "undo", text: (t) => `Rolled back to the server's row: ${cards(t, e.keys)}` };
    case "applied":
      return { icon: "✓", tone: "ok", text: (t) => `Server applied ${card(t, e.pk)}${e.seq ? ` at commit ${e.seq}` : ""}` };
    case "rejected": {
      const after = e.serverRow ? "back to the server's row" : "the server's row: none, the card is gone";
      return { icon: "✗", tone: "bad", kind: e.reason,
        text: (t) => `Server refused the ${writeOf(e.mutation, t)}: ${e.reason}, ${e.message ?? "no reason given"}; ${after}` };
    }
    case "deadLetter":
      return { icon: "☠", tone: "bad", kind: "DEAD_LETTER",
        text: (t) => `Dead letter after ${e.entry.permanentFailures} refusals: the ${writeOf(e.entry, t)} (${e.error}). Requeue or discard it in the outbox` };
    case "pushFailed":
    case "pullFailed": {
      const what = name === "pushFailed" ? "Push" : "Pull";
      if (e.retryable) return { icon: "⚠", tone: "warn", text: () => `${what} failed: ${e.code}, ${e.message}; will retry` };
      return { icon: "⊘", tone: "bad",
        text: () => `${what} refused: ${e.code}, ${e.message}; a refusal that would repeat: a write refused 5 times becomes a dead letter` };
    }
    case "pullProgress":
      if (e.pages !== 1 || e.total === null || e.entries >= e.total) return null;
      return { icon: "⬇", tone: "remote", text: () => `Pull started: ${count(e.total)} entries to fetch` };
    case "checkpoint":
      return { icon: "⤓", tone: "remote", text: () => `Checkpoint committed at horizon ${e.horizon}` };
    case "conflicts":
      return e.conflicts.map((c) => ({ icon: "⚔", tone: "warn", kind: "CONFLICT",
        text: (t) => `Conflict on ${card(t, c.pk)}, ${c.column}: ${short(c.loser)} lost to ${short(c.winner)}` }));
    case "checkpointExpired":
      return { icon: "⟳", tone: "warn", text: () => "Checkpoint expired: pulling everything again" };
    case "serverReset":
      return { icon: "⟳", tone: "warn", text: () => "The server was reset: pulling everything again" };
    case "rehydrated":
      return { icon: "⟳", tone: "remote", text: () => `Pulled everything again, up to horizon ${e.horizon}` };
    default:
      return null;
  }
}

export class Feed {
  constructor() { this.entries = []; this.serial = 0; }

  add({ icon, tone = "info", kind = "", text }) {
    const at = Date.now();
    const top = this.entries[0];
    const probe = text(() => null);
    if (top && top.icon === icon && top.probe === probe) { top.times += 1; top.at = at; return; }
    this.entries.unshift({ serial: ++this.serial, icon, tone, kind, text, probe, at, times: 1 });
    this.entries.length = Math.min(this.entries.length, LIMIT);
  }

  heard(name, event) {
    const lines = describe(name, event);
    for (const line of [lines].flat()) if (line) this.add(line);
  }

  note(icon, text) { this.add({ icon, tone: "info", text: () => text }); }

  error(e) { this.add({ icon: "⊘", tone: "bad", text: () => `${e?.code ?? "Error"}: ${e?.message ?? e}` }); }
}
