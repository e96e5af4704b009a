// A device's outbox: each write waiting for its verdict and why it waits (queued, sent, retrying
// after a network failure, refused n of 5 times, waiting behind an earlier write), and the dead
// letters, each with Requeue and Discard.
import { h, clock, until, quote } from "./dom.js";
import { assigneeName, listName } from "./team.js";

/** The client dead-letters a write at its fifth consecutive permanent refusal (npm/README.md). */
const REFUSALS = 5;

function columnsOf(columns) {
  return Object.entries(columns ?? {})
    .filter(([k]) => k !== "id" && k !== "position")
    .map(([k, v]) => `${k} → ${k === "assignee" && v ? assigneeName(v) : k === "list" ? listName(v) : quote(v ?? "nothing", 24)}`)
    .join(", ");
}

export function describeWrite(w, device) {
  const title = quote(device.titleOf(w.pk) ?? w.columns?.title ?? "a card", 30);
  if (w.op === "delete") return `✗ delete ${title}`;
  if (w.op === "upsert") return `✚ new card ${title} in ${listName(w.columns?.list)}`;
  return `✎ ${title}: ${columnsOf(w.columns)}`;
}

function stateOf(w, earlier, device, now) {
  if (w.permanentFailures > 0) {
    return ["refused", `refused ${w.permanentFailures} of ${REFUSALS} times (${w.lastError}); next try at ${clock(w.retryAt)} (${until(w.retryAt, now)})`];
  }
  if (device.network.isOffline()) return ["queued", "waiting for the network"];
  const blocker = earlier.find((e) => e.retryAt && e.retryAt > now && e.applyAfter === null);
  if (blocker) return ["waiting", `waiting behind #${blocker.seq}: writes go in the order they were made`];
  if (w.retryAt && w.retryAt > now) return ["retrying", `retrying at ${clock(w.retryAt)} (${until(w.retryAt, now)}) after ${w.lastError}`];
  return w.sent ? ["sent", `sent ${w.attempts} ${w.attempts === 1 ? "time" : "times"}, waiting for the verdict`] : ["queued", "queued"];
}

export function renderOutbox(root, device) {
  const now = Date.now();
  const pending = device.pending();
  const dead = device.deadLetters();
  const summary = `${pending.length} pending · ${dead.length} dead ${dead.length === 1 ? "letter" : "letters"}`;
  const writes = pending.map((w, i) => {
    const [state, words] = stateOf(w, pending.slice(0, i), device, now);
    return h("li", { class: `write ${state}`, dataset: { seq: w.seq, state } },
      h("span", { class: "what" }, `#${w.seq} ${describeWrite(w, device)}`), h("span", { class: "state" }, words));
  });
  const letters = dead.map((l) => h("li", { class: "write dead-letter", dataset: { seq: l.entry.seq } },
    h("span", { class: "what" }, `☠ #${l.entry.seq} ${describeWrite(l.entry, device)}`),
    h("span", { class: "state" }, `refused ${REFUSALS} times (${l.error}), dead at ${clock(l.deadAt)}`),
    h("span", { class: "buttons" },
      h("button", { type: "button", class: "requeue", onclick: () => device.attempt(device.requeue(l.entry.seq)) }, "Requeue"),
      h("button", { type: "button", class: "discard", onclick: () => device.attempt(device.discard(l.entry.seq)) }, "Discard"))));
  root.replaceChildren(
    h("h3", {}, "Outbox ", h("small", { class: "summary" }, summary)),
    writes.length || letters.length ? h("ol", { class: "writes" }, writes, letters)
      : h("p", { class: "empty" }, "Empty: every write has its verdict."));
}
