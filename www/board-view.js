// A device's board: its lists side by side, each with its cards, a fingerprint to compare with
// the other device, and a field to add a card. Cards are kept by id and rebuilt only when what
// they show changed, so a card being edited keeps its editor and a re-render moves nothing else.
import { h, count, quote } from "./dom.js";
import { ARCHIVE, ASSIGNEES, ALL_LISTS, LISTS, assigneeName } from "./team.js";
import { fingerprint } from "./fingerprint.js";

/** How many archive cards are drawn; the rest are counted. */
const ARCHIVE_SHOWN = 20;

export class BoardView {
  constructor(root, device) {
    this.root = root;
    this.device = device;
    this.cards = new Map();   // id -> { el, signature }
    this.editing = null;      // the id of the card whose editor is open
    this.sections = new Map();
    this.revealed = new Set();   // (scenario cards, first card, list, its height) already scrolled to
  }

  render() {
    const d = this.device;
    if (this.editing && !d.card(this.editing)) this.editing = null;
    const pending = new Set(d.pending().map((w) => w.pk));
    const dead = new Set(d.deadLetters().map((l) => l.entry.pk));
    const wanted = [...LISTS, ARCHIVE];
    const sections = wanted.map((list) => this.section(list, pending, dead));
    if (this.root.children.length !== sections.length || sections.some((s, i) => this.root.children[i] !== s)) {
      this.root.replaceChildren(...sections);
    }
    for (const id of this.cards.keys()) if (!d.card(id) && id !== this.editing) this.cards.delete(id);
    this.reveal();
  }

  /** Scrolls each list holding cards of the scenario to the first of them: again only when that
   * card moves to another list or grows (a conflict line). */
  reveal() {
    const first = new Map();
    for (const id of this.device.spot) {
      const el = this.cards.get(id)?.el;
      if (!el?.isConnected) continue;
      const list = el.parentElement;
      if (!first.has(list) || el.offsetTop < first.get(list).offsetTop) first.set(list, el);
    }
    for (const [list, el] of first) {
      const key = `${[...this.device.spot].join()}:${el.dataset.id}:${el.closest(".list").dataset.list}:${el.offsetHeight}`;
      if (this.revealed.has(key)) continue;
      this.revealed.add(key);
      list.scrollTop = el.offsetTop - 4;
    }
  }

  section(list, pending, dead) {
    const d = this.device;
    let s = this.sections.get(list.id);
    if (!s) {
      s = this.build(list);
      this.sections.set(list.id, s);
    }
    const rows = d.lists.get(list.id)?.rows ?? [];
    const member = list.members.includes(d.user);
    const joined = list !== ARCHIVE || d.archive;
    s.el.classList.toggle("not-joined", !joined);
    s.facts.hidden = !joined;
    s.cardsEl.hidden = !joined;
    if (s.add) s.add.hidden = !joined;
    s.join.textContent = joined ? "Leave the archive" : "Join the archive";
    s.join.hidden = list !== ARCHIVE;
    s.hiddenNote.hidden = member || !joined;
    s.hiddenNote.textContent = `${d.person.name} is not on this list: the server's policy sends none of its cards.`;
    s.count.textContent = `${count(rows.length)} ${rows.length === 1 ? "card" : "cards"}`;
    s.fingerprint.textContent = rows.length ? `#${fingerprint(rows)}` : "";
    const shown = list === ARCHIVE ? rows.slice(0, ARCHIVE_SHOWN) : rows;
    s.more.hidden = rows.length <= shown.length || !joined;
    s.more.textContent = `and ${count(rows.length - shown.length)} more`;
    this.place(s.cardsEl, shown.map((row) => this.cardEl(row, pending.has(row.id), dead.has(row.id))));
    return s.el;
  }

  build(list) {
    const d = this.device;
    const count = h("span", { class: "count" });
    const print = h("code", { class: "fingerprint", title: "A fingerprint of this list's cards: equal on two devices when they show the same cards" });
    const facts = h("p", { class: "facts" }, count, " ", print);
    const hiddenNote = h("p", { class: "hidden-note" });
    const cardsEl = h("ol", { class: "cards" });
    const more = h("p", { class: "more" });
    const join = h("button", { type: "button", class: "join", onclick: () => d.attempt(d.setArchive(!d.archive)) });
    let add = null;
    if (list !== ARCHIVE) {
      const input = h("input", { name: "title", placeholder: "Add a card…", autocomplete: "off", "aria-label": `New card in ${list.name}` });
      add = h("form", { class: "add", onsubmit: (event) => {
        event.preventDefault();
        const title = input.value;
        if (!title.trim()) return;
        input.value = "";
        d.attempt(d.addCard(list.id, title));
      } }, input, h("button", {}, "Add"));
    }
    const el = h("section", { class: "list", dataset: { list: list.id } },
      h("header", {}, h("h3", {}, list.name), h("span", { class: "who" }, list.members.map(assigneeName).join(" · "))),
      facts, hiddenNote, cardsEl, more, add, join);
    return { el, count, fingerprint: print, facts, hiddenNote, cardsEl, more, join, add };
  }

  /** Puts `els` in `parent` in order, moving only what is out of place. */
  place(parent, els) {
    els.forEach((el, i) => { if (parent.children[i] !== el) parent.insertBefore(el, parent.children[i] ?? null); });
    while (parent.children.length > els.length) parent.lastElementChild.remove();
  }

  cardEl(row, isPending, isDead) {
    const conflicts = [...(this.device.conflicts.get(row.id)?.values() ?? [])];
    const spot = this.device.spot.has(row.id);
    const signature = JSON.stringify([row, isPending, isDead, conflicts, spot]);
    let kept = this.cards.get(row.id);
    if (!kept) {
      kept = { el: h("li", { class: "card", dataset: { id: row.id } }), signature: null };
      this.cards.set(row.id, kept);
    }
    if (this.editing === row.id || kept.signature === signature) return kept.el;
    kept.signature = signature;
    const d = this.device;
    const el = kept.el;
    el.className = "card" + (row.done ? " done" : "") + (isPending ? " pending" : "") + (isDead ? " dead" : "") + (spot ? " spot" : "");
    const tick = h("input", { type: "checkbox", class: "tick", checked: !!row.done, "aria-label": `Done: ${row.title}`,
      onchange: () => d.attempt(d.edit(row.id, { done: tick.checked })) });
    el.replaceChildren(
      tick,
      h("div", { class: "body" },
        h("p", { class: "title" }, row.title),
        row.notes ? h("p", { class: "notes" }, row.notes) : null,
        h("p", { class: "meta" },
          row.assignee ? h("span", { class: "assignee" }, assigneeName(row.assignee)) : null,
          row.revision ? h("span", { class: "revision", title: "How many writes the server applied to this card" }, `${row.revision} ${row.revision === 1 ? "write" : "writes"}`) : null,
          isPending ? h("span", { class: "badge pending" }, "◷ pending") : null,
          isDead ? h("span", { class: "badge dead" }, "☠ dead letter") : null),
        conflicts.map((c) => h("p", { class: "conflict" }, `⚔ ${c.column}: ${quote(c.loser ?? "nothing", 30)} lost to ${quote(c.winner ?? "nothing", 30)}`))),
      h("button", { type: "button", class: "edit", "aria-label": `Edit ${row.title}`, onclick: () => this.openEditor(row) }, "✎"),
    );
    return el;
  }

  openEditor(row) {
    const d = this.device;
    const el = this.cards.get(row.id)?.el;
    if (!el) return;
    this.closeEditor();
    this.editing = row.id;
    const field = (label, control) => h("label", {}, h("span", {}, label), control);
    const title = h("input", { name: "title", value: row.title ?? "", autocomplete: "off" });
    const notes = h("textarea", { name: "notes", rows: 2, value: row.notes ?? "" });
    const assignee = h("select", { name: "assignee" },
      h("option", { value: "" }, "nobody"),
      ASSIGNEES.map((a) => h("option", { value: a.key, selected: row.assignee === a.key }, a.name)));
    const list = h("select", { name: "list" }, ALL_LISTS.map((l) => h("option", { value: l.id, selected: row.list === l.id }, l.name)));
    const done = () => { this.editing = null; this.cards.get(row.id).signature = null; d.changed(); };
    const form = h("form", { class: "editor", onsubmit: (event) => {
      event.preventDefault();
      const next = { title: title.value, notes: notes.value || null, assignee: assignee.value || null };
      const changed = Object.fromEntries(Object.entries(next).filter(([k, v]) => (row[k] ?? null) !== v));
      if (list.value !== row.list) Object.assign(changed, { list: list.value, position: d.endOf(list.value) });
      done();
      if (Object.keys(changed).length) d.attempt(d.edit(row.id, changed));
    } },
    field("Title", title), field("Notes", notes), field("Assignee", assignee), field("List", list),
    h("div", { class: "buttons" },
      h("button", { type: "submit" }, "Save"),
      h("button", { type: "button", class: "delete", onclick: () => { done(); d.attempt(d.remove(row.id)); } }, "Delete"),
      h("button", { type: "button", class: "cancel", onclick: done }, "Cancel")));
    el.replaceChildren(form);
    title.focus();
  }

  closeEditor() {
    if (this.editing && this.cards.has(this.editing)) this.cards.get(this.editing).signature = null;
    this.editing = null;
  }
}
