// Where a device's sync stands: its committed checkpoint, its health, the server's verdicts so
// far, whether this tab runs the device's sync, and the progress of a long pull.
import { h, clock, count } from "./dom.js";

export function renderStatus(root, device) {
  const client = device.client;
  if (!client) return root.replaceChildren(h("p", { class: "empty" }, "Opening…"));
  const cp = client.getCheckpoint(), health = client.getSyncHealth(), s = client.status();
  const healthWords = health.failureStreak === 0 ? "✓ healthy"
    : `⚠ ${health.failureStreak} failed ${health.failureStreak === 1 ? "request" : "requests"} in a row: ${health.lastError}`;
  const facts = [
    ["Checkpoint", cp.cursor ? `horizon ${cp.horizon}, committed ${clock(cp.committedAt)}` : "none yet", "checkpoint"],
    ["Sync health", healthWords, "health"],
    ["Last success", clock(health.lastSuccessAt), "success"],
    ["Verdicts", `${s.applied} applied · ${s.rejected} refused · ${s.deadLetters} dead ${s.deadLetters === 1 ? "letter" : "letters"}`, "verdicts"],
    ["This tab", health.leader ? "runs this device's sync" : "follows the tab that runs it", "leader"],
  ];
  root.replaceChildren(h("h3", {}, "Sync"), h("dl", {}, facts.map(([k, v, name]) => [h("dt", {}, k), h("dd", { class: name }, v)])));
}

export function renderProgress(root, device) {
  const p = device.progress;
  root.hidden = !p;
  if (!p) return;
  const total = p.total ?? p.entries;
  const percent = total ? Math.floor((100 * p.entries) / total) : 0;
  root.replaceChildren(
    h("progress", { max: total || 1, value: p.entries, "aria-label": "Pull progress" }),
    h("span", { class: "label" }, p.done ? `✓ Pulled ${count(p.entries)} entries` : `Pulling ${count(p.entries)} of ${p.total === null ? "?" : count(p.total)} entries (${percent}%)`));
  root.dataset.done = p.done ? "yes" : "no";
}
