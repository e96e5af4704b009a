// Building elements without innerHTML (the page's CSP allows no inline anything), and the few
// formats the page shows.

/** `h("li", { class: "card", dataset: { id }, onclick }, child, ...)`: an element. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key in el) el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false).map((c) => (c instanceof Node ? c : String(c))));
  return el;
}

export const clock = (ms) => (ms ? new Date(ms).toLocaleTimeString("en-GB") : "never");
export const count = (n) => Number(n).toLocaleString("en-US");

/** "in 3 s" / "now": how long until `ms`. */
export function until(ms, now = Date.now()) {
  const s = Math.ceil((ms - now) / 1000);
  return s <= 0 ? "now" : `in ${s} s`;
}

/** `“text”`, cut to `max` characters. */
export function quote(text, max = 40) {
  const s = String(text ?? "");
  return `“${s.length > max ? s.slice(0, max - 1) + "…" : s}”`;
}
