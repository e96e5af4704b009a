// A device's feed, newest first.
import { h, clock } from "./dom.js";

export function renderFeed(root, device) {
  const titleOf = (id) => device.titleOf(id);
  root.replaceChildren(...device.feed.entries.map((e) => h("li", { class: `tone-${e.tone}`, dataset: { kind: e.kind } },
    h("span", { class: "icon", "aria-hidden": "true" }, e.icon),
    h("span", { class: "text" }, e.text(titleOf)),
    e.times > 1 ? h("span", { class: "times" }, `×${e.times}`) : null,
    h("time", {}, clock(e.at)))));
}
