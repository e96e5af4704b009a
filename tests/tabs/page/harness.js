// The page the tabs tests drive: one client per page, every event it hears recorded, and an
// account of the timers the page holds armed. The timer wrappers go in before the package loads.
// handle -> what it is, so a test that finds one left can say which.
const armed = new Map();
const { setTimeout: realSetTimeout, clearTimeout: realClearTimeout, setInterval: realSetInterval, clearInterval: realClearInterval } = globalThis;
globalThis.setTimeout = (fn, ms, ...args) => {
  const handle = realSetTimeout(() => { armed.delete(handle); if (typeof fn === "function") fn(...args); }, ms);
  armed.set(handle, `timeout of ${ms} ms`);
  return handle;
};
globalThis.clearTimeout = (handle) => { armed.delete(handle); realClearTimeout(handle); };
globalThis.setInterval = (fn, ms, ...args) => { const handle = realSetInterval(fn, ms, ...args); armed.set(handle, `interval of ${ms} ms`); return handle; };
globalThis.clearInterval = (handle) => { armed.delete(handle); realClearInterval(handle); };

const EVENTS = ["change", "applied", "rejected", "deadLetter", "pushFailed", "pullFailed", "pullProgress", "checkpoint", "conflicts", "checkpointExpired", "serverReset", "rehydrated"];

function tokenFor(sub) {
  let cached = null;
  return async () => {
    if (cached && cached.expiresAt > Date.now() + 60_000) return cached.token;
    const res = await fetch("/kizuna/v1/dev-token", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }) });
    if (!res.ok) return null;
    const { token, expires_in } = await res.json();
    cached = { token, expiresAt: Date.now() + expires_in * 1000 };
    return token;
  };
}

const kizuna = await import("/pkg/kizunasync.js");
await kizuna.default();

window.test = {
  client: null,
  seen: Object.fromEntries(EVENTS.map((e) => [e, []])),
  armedTimers: () => armed.size,
  armedTimerKinds: () => [...armed.values()],
  async open(name, sub, options = {}) {
    const { buckets = [], ...rest } = options;
    this.client = await kizuna.KizunaClient.open({ name, url: location.origin, token: tokenFor(sub), buckets: [`user:${sub}`, ...buckets], ...rest });
    for (const e of EVENTS) this.client.on(e, (payload) => this.seen[e].push({ at: performance.now(), ...payload }));
  },
  leads() {
    return this.client?.getSyncHealth().leader === true;
  },
};
document.getElementById("state").textContent = "ready";
