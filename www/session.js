// A signed-in user's access token, as an auth library keeps one: minted by the demo gateway's
// development endpoint (never part of a production gateway) and kept in localStorage, so a device
// that reloads while offline still has its session and its requests fail as offline ones.

export function sessionFor(sub, network) {
  const key = `kizuna-demo:token:${sub}`;
  return async () => {
    const kept = JSON.parse(localStorage.getItem(key) ?? "null");
    if (kept && kept.expiresAt > Date.now() + 60_000) return kept.token;
    if (network.isOffline()) return kept?.token ?? null;
    const res = await fetch("/kizuna/v1/dev-token", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ sub }),
    });
    if (!res.ok) return null;
    const { token, expires_in } = await res.json();
    localStorage.setItem(key, JSON.stringify({ token, expiresAt: Date.now() + expires_in * 1000 }));
    return token;
  };
}
