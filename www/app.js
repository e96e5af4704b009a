// The demo: a todo list on Kizuna. Writes land locally at once; the client pushes and pulls on
// timers, and the server's wake stream makes other windows pull soon after a change.
import init, { KizunaClient } from "/pkg/kizunasync.js";

const $ = (id) => document.getElementById(id);
let client = null;
let offline = false;

async function tokenFor(sub) {
  let cached = null;
  return async () => {
    if (cached && cached.expiresAt > Date.now() + 60_000) return cached.token;
    const res = await fetch("/kizuna/v1/dev-token", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }),
    });
    if (!res.ok) return null;
    const { token, expires_in } = await res.json();
    cached = { token, expiresAt: Date.now() + expires_in * 1000 };
    return token;
  };
}

// "Simulate offline" refuses every request the way a dropped network would.
const demoFetch = (url, init) => offline ? Promise.reject(new TypeError("offline (simulated)")) : fetch(url, init);

function log(kind, detail) {
  const li = document.createElement("li");
  li.className = kind;
  li.textContent = `${new Date().toLocaleTimeString()} ${kind} ${detail ?? ""}`;
  $("log").prepend(li);
  while ($("log").children.length > 100) $("log").lastChild.remove();
}

async function render() {
  // The client of this render: a sign-in may replace (and close) `client` while it awaits.
  const shown = client;
  if (!shown) return;
  const rows = await shown.list("todos").catch(() => null);
  if (!rows || shown !== client) return;
  const pending = new Set(client.pendingWrites().map((w) => w.pk));
  rows.sort((a, b) => (a.position ?? 0) - (b.position ?? 0));
  $("todos").replaceChildren(...rows.map((row) => {
    const li = document.createElement("li");
    li.className = row.done ? "done" : "";
    const box = Object.assign(document.createElement("input"), { type: "checkbox", checked: !!row.done });
    box.onchange = () => client.patch("todos", row.id, { done: box.checked }).catch((e) => log("error", e.message));
    const title = Object.assign(document.createElement("span"), { className: "title", textContent: row.title });
    const mark = Object.assign(document.createElement("span"), { className: "pending", textContent: pending.has(row.id) ? "pending" : "" });
    const remove = Object.assign(document.createElement("button"), { className: "remove", textContent: "Delete" });
    remove.onclick = () => client.delete("todos", row.id).catch((e) => log("error", e.message));
    li.append(box, title, mark, remove);
    return li;
  }));
  const status = client.status(), health = client.getSyncHealth(), cp = client.getCheckpoint();
  const facts = {
    "horizon": cp.horizon, "committed": cp.committedAt ? new Date(cp.committedAt).toLocaleTimeString() : "never",
    "pending": status.pending, "retrying": status.retrying, "dead letters": status.deadLetters,
    "applied": status.applied, "rejected": status.rejected, "failure streak": health.failureStreak,
    "last error": health.lastError ?? "none", "this tab": health.leader ? "leads the sync" : "follows the leading tab",
  };
  $("status").replaceChildren(...Object.entries(facts).flatMap(([k, v]) => [
    Object.assign(document.createElement("dt"), { textContent: k }),
    Object.assign(document.createElement("dd"), { textContent: String(v) }),
  ]));
}

// One local database per user, shared by every tab that signs in as that user: one tab leads and
// runs the sync loops for all (with its own "Simulate offline" switch), the others hear its news.
// Sign-ins run one after another, so a switch closes the old client before opening the new one.
let signingIn = Promise.resolve();
function signIn(sub) {
  signingIn = signingIn.then(() => switchUser(sub)).catch((e) => log("error", `${e.code}: ${e.message}`));
  return signingIn;
}

async function switchUser(sub) {
  if (client) client.close();
  client = null;
  client = await KizunaClient.open({
    name: `kizuna-demo-${sub}`, url: location.origin, token: await tokenFor(sub),
    buckets: [`user:${sub}`], fetch: demoFetch, pullIntervalMs: 10_000,
  });
  for (const name of ["change", "applied", "rejected", "deadLetter", "pushFailed", "checkpoint", "pullProgress", "checkpointExpired", "rehydrated", "conflicts"]) {
    client.on(name, (e) => {
      if (name !== "change") log(name, name === "rejected" ? `${e.reason} on ${e.mutation.pk}` : JSON.stringify(e).slice(0, 120));
      render();
    });
  }
  await render();
  client.sync().catch((e) => log("pushFailed", `${e.code}: ${e.message}`)).finally(render);
}

await init();
$("user").onchange = () => signIn($("user").value);
$("offline").onchange = () => { offline = $("offline").checked; log(offline ? "offline" : "online"); };
$("sync").onclick = () => client && client.sync().then((r) => log("sync", JSON.stringify(r))).catch((e) => log("pushFailed", `${e.code}: ${e.message}`)).finally(render);
$("add").onsubmit = async (event) => {
  event.preventDefault();
  const id = crypto.randomUUID();
  try {
    await client.put("todos", id, { id, title: $("title").value, done: false, position: Date.now() });
    $("title").value = "";
  } catch (e) { log("error", `${e.code}: ${e.message}`); }
};
setInterval(render, 2000);
await signIn($("user").value);
