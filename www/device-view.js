// One device's panel: who is signed in, its network switch, its board, outbox, sync state and feed.
import { h } from "./dom.js";
import { PEOPLE } from "./team.js";
import { BoardView } from "./board-view.js";
import { renderOutbox } from "./outbox-view.js";
import { renderStatus, renderProgress } from "./status-view.js";
import { renderFeed } from "./feed-view.js";

export class DeviceView {
  constructor(root, device) {
    this.device = device;
    const d = device;
    this.user = h("select", { class: "user", "aria-label": `${d.label}: signed in as`, onchange: () => d.attempt(d.signIn(this.user.value)) },
      PEOPLE.map((p) => h("option", { value: p.key }, p.name)));
    this.online = h("input", { type: "checkbox", role: "switch", class: "online", onchange: () => d.setOffline(!this.online.checked) });
    this.onlineWord = h("span", { class: "online-word" });
    this.progress = h("div", { class: "progress", hidden: true });
    this.boardEl = h("div", { class: "board" });
    this.board = new BoardView(this.boardEl, d);
    this.outbox = h("section", { class: "outbox" });
    this.status = h("section", { class: "status" });
    this.feed = h("ol", { class: "feed", "aria-live": "polite" });
    root.replaceChildren(
      h("header", { class: "device-head" },
        h("h2", {}, d.label),
        h("label", { class: "who" }, "Signed in as ", this.user),
        h("label", { class: "switch" }, this.online, this.onlineWord),
        h("button", { type: "button", class: "sync", onclick: () => d.syncNow() }, "Sync now")),
      this.progress, this.boardEl,
      h("div", { class: "panels" }, this.outbox, this.status),
      h("section", { class: "feed-panel" }, h("h3", {}, "Feed"), this.feed));
    d.onChange(() => this.render());
    this.render();
  }

  render() {
    const d = this.device;
    if (document.activeElement !== this.user) this.user.value = d.user;
    const offline = d.network.isOffline();
    this.online.checked = !offline;
    this.onlineWord.textContent = offline ? "Offline" : "Online";
    this.online.closest(".device")?.classList.toggle("offline", offline);
    renderProgress(this.progress, d);
    this.board.render();
    renderOutbox(this.outbox, d);
    renderStatus(this.status, d);
    renderFeed(this.feed, d);
  }
}
