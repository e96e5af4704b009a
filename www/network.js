// A device's network, with an online/offline switch. Offline, every request fails as a dropped
// network does (a TypeError, before anything is sent), and going offline cuts the requests in
// flight, the wake stream included. The switch is kept in localStorage, so every tab of the page
// (whichever of them runs the device's sync) and a reload see the same state.

export function simulatedNetwork(slot) {
  const key = `kizuna-demo:${slot}:offline`;
  const listeners = new Set();
  let period = new AbortController();
  const isOffline = () => localStorage.getItem(key) === "1";
  const cut = () => { period.abort(new DOMException("the device went offline", "AbortError")); period = new AbortController(); };
  const announce = () => { for (const listener of listeners) listener(isOffline()); };

  window.addEventListener("storage", (event) => {
    if (event.key !== key) return;
    if (isOffline()) cut();
    announce();
  });

  return {
    isOffline,
    setOffline(offline) {
      if (offline === isOffline()) return;
      if (offline) localStorage.setItem(key, "1"); else localStorage.removeItem(key);
      if (offline) cut();
      announce();
    },
    onChange(listener) { listeners.add(listener); return () => listeners.delete(listener); },
    /** The `fetch` handed to the client. */
    fetch(input, init = {}) {
      if (isOffline()) return Promise.reject(new TypeError("Failed to fetch: the device is offline"));
      const signal = init.signal ? AbortSignal.any([init.signal, period.signal]) : period.signal;
      return fetch(input, { ...init, signal });
    },
  };
}
