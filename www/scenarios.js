// The scenarios a visitor runs in a click or two. Each step does what a person would do on the
// devices (the same calls the board's buttons make) and says what happened; `watch` is the one
// line that tells the visitor what to look at. Device 1 is Alice and device 2 is Bob throughout.
import { quote } from "./dom.js";

const runs = new Map();
/** The scenario's card title, numbered from its second run on. */
function titled(id, base) {
  const n = (runs.get(`${id}:${base}`) ?? 0) + 1;
  runs.set(`${id}:${base}`, n);
  return n === 1 ? base : `${base} (${n})`;
}

/** Alice on device 1 and Bob on device 2, both online, each with a committed checkpoint. */
async function ready({ d1, d2 }) {
  for (const [d, user] of [[d1, "alice"], [d2, "bob"]]) {
    d.setOffline(false);
    if (d.user !== user) await d.signIn(user);
    await d.opening;
  }
  for (const d of [d1, d2]) await d.waitFor("a first checkpoint", (x) => x.client?.getCheckpoint().cursor);
}

/** Outlines the scenario's cards on both devices and scrolls them into view. */
function spotlight({ d1, d2 }, ...ids) {
  for (const d of [d1, d2]) d.spotlight(ids);
}

const shows = (d, id) => d.waitFor("the card", (x) => x.card(id));
const gone = (d, id) => d.waitFor("the card to go", (x) => !x.card(id));
const delivered = (d, id) => d.waitFor("its verdict", (x) => !x.isPending(id));
async function reconnect(d, id) {
  d.setOffline(false);
  await delivered(d, id);
}

/** A new card on device 1, applied and pulled by both devices. */
async function shared(ctx, id, base, list = "launch") {
  const card = await ctx.d1.addCard(list, titled(id, base));
  spotlight(ctx, card);
  await delivered(ctx.d1, card);
  // Device 1 pulls its own row back before the scenario edits it: an edit made on a checkpoint
  // below the card's insert would be journalled as overwriting a value it had not seen, its own.
  await ctx.d1.waitFor("its own row pulled", (x) => x.card(card)?.revision);
  await shows(ctx.d2, card);
  return card;
}

export const SCENARIOS = [
  {
    id: "converge",
    title: "Offline edits converge",
    watch: "Offline, each device shows only its own new card, pending in its outbox; reconnected, both show both and the Launch fingerprints match.",
    steps: [
      { label: "Go offline and edit", run: async (ctx) => {
        await ready(ctx);
        ctx.d1.setOffline(true);
        ctx.d2.setOffline(true);
        ctx.cards = [await ctx.d1.addCard("launch", titled("converge", "Order the launch cake")),
                     await ctx.d2.addCard("launch", titled("converge", "Print the stickers"))];
        spotlight(ctx, ...ctx.cards);
        return "Both devices are offline, each with its own new card pending. Reconnect them.";
      } },
      { label: "Reconnect both", run: async (ctx) => {
        await reconnect(ctx.d1, ctx.cards[0]);
        await reconnect(ctx.d2, ctx.cards[1]);
        for (const d of [ctx.d1, ctx.d2]) for (const id of ctx.cards) await shows(d, id);
        return "Converged: both devices show both cards, and their Launch fingerprints are equal.";
      } },
    ],
  },
  {
    id: "columns",
    title: "Different columns of one card",
    watch: "Offline, device 1 renames the card and device 2 writes its notes; reconnected, both keep both: a write assigns only the columns it names.",
    steps: [
      { label: "Edit offline", run: async (ctx) => {
        await ready(ctx);
        ctx.card = await shared(ctx, "columns", "Print the posters");
        ctx.title = titled("columns", "Print the posters in A3");
        ctx.d1.setOffline(true);
        ctx.d2.setOffline(true);
        await ctx.d1.edit(ctx.card, { title: ctx.title });
        await ctx.d2.edit(ctx.card, { notes: "Matte paper, 200 copies" });
        return "Device 1 renamed the card, device 2 wrote its notes, both offline. Reconnect them.";
      } },
      { label: "Reconnect both", run: async (ctx) => {
        await reconnect(ctx.d1, ctx.card);
        await reconnect(ctx.d2, ctx.card);
        for (const d of [ctx.d1, ctx.d2]) {
          await d.waitFor("both columns", (x) => x.card(ctx.card)?.title === ctx.title && x.card(ctx.card)?.notes);
        }
        return `Both survive on both devices: the title ${quote(ctx.title)} and the notes.`;
      } },
    ],
  },
  {
    id: "same-column",
    title: "The same column on both",
    watch: "Both rename the card offline; device 2 reconnects last, so its title wins everywhere (arrival order) and the conflict journal shows device 1's title as the loser.",
    steps: [
      { label: "Rename on both, offline", run: async (ctx) => {
        await ready(ctx);
        ctx.card = await shared(ctx, "same-column", "Name the release");
        ctx.d1.setOffline(true);
        ctx.d2.setOffline(true);
        ctx.loser = titled("same-column", "Release name: Aurora");
        ctx.winner = titled("same-column", "Release name: Borealis");
        await ctx.d1.edit(ctx.card, { title: ctx.loser });
        await ctx.d2.edit(ctx.card, { title: ctx.winner });
        return "Each device shows its own title. Reconnect: device 1 first, then device 2.";
      } },
      { label: "Reconnect 1, then 2", run: async (ctx) => {
        await reconnect(ctx.d1, ctx.card);
        await reconnect(ctx.d2, ctx.card);
        for (const d of [ctx.d1, ctx.d2]) {
          await d.waitFor("the later title", (x) => x.card(ctx.card)?.title === ctx.winner);
          await d.waitFor("the conflict", (x) => x.conflicts.get(ctx.card)?.has("title"));
        }
        return `${quote(ctx.winner)} arrived last and holds the title; ${quote(ctx.loser)} is shown as the loser.`;
      } },
    ],
  },
  {
    id: "delete-wins",
    title: "A delete against an edit",
    watch: "Device 1 deletes the card while device 2, offline, edits it; reconnected, device 2's edit is refused DELETE_WINS and the card goes, as on the server.",
    steps: [
      { label: "Edit offline, delete online", run: async (ctx) => {
        await ready(ctx);
        ctx.card = await shared(ctx, "delete-wins", "Order the banners");
        ctx.d2.setOffline(true);
        await ctx.d2.edit(ctx.card, { notes: "Blue, with the logo" });
        await ctx.d1.remove(ctx.card);
        await delivered(ctx.d1, ctx.card);
        return "Device 1 deleted the card on the server; device 2 still shows it with its pending edit. Reconnect device 2.";
      } },
      { label: "Reconnect device 2", run: async (ctx) => {
        ctx.d2.setOffline(false);
        await gone(ctx.d2, ctx.card);
        return "Refused DELETE_WINS: the card is gone on device 2 too, the server's row is none.";
      } },
    ],
  },
  {
    id: "refused",
    title: "The server refuses a write",
    watch: "A title over 80 characters fails the validation gate on device 1, and Bob may not add to Ops on device 2: each write is rolled back, its reason in the feed.",
    steps: [
      { label: "Make both writes", run: async (ctx) => {
        await ready(ctx);
        const title = titled("refused", "Send the invitations");
        const card = await ctx.d1.addCard("launch", title);
        spotlight(ctx, card);
        await delivered(ctx.d1, card);
        await ctx.d1.edit(card, { title: "Send the invitations to everyone on the mailing list, the press, partners and friends" });
        const ops = await ctx.d2.addCard("ops", titled("refused", "Bob's card in Ops"));
        spotlight(ctx, card, ops);
        await ctx.d1.waitFor("the title restored", (x) => x.card(card)?.title === title && !x.isPending(card));
        await gone(ctx.d2, ops);
        return "Both rolled back: the gate refused the long title (VALIDATION_FAILED), Bob's policy refused the card (RLS_DENIED).";
      } },
    ],
  },
  {
    id: "dead-letter",
    title: "A poisoned write dead-letters",
    watch: "Device 1 assigns a card to Dave, who left the team: the foreign key refuses the whole request at commit, five times with growing waits, then it is a dead letter and the edit behind it goes. Device 2's edits go through meanwhile.",
    steps: [
      { label: "Assign the card to Dave", run: async (ctx, say) => {
        await ready(ctx);
        const faq = await shared(ctx, "dead-letter", "Update the FAQ");
        const translate = await shared(ctx, "dead-letter", "Translate the FAQ");
        spotlight(ctx, faq, translate);
        await ctx.d1.edit(faq, { assignee: "dave" });
        await ctx.d1.edit(translate, { done: true });
        await ctx.d2.edit(translate, { notes: "Spanish first" });
        say("Device 1's outbox: the assignment is refused and retried; its next edit waits behind it. Device 2's edit is applied at once.");
        await ctx.d1.waitFor("the dead letter", (x) => x.deadLetters().some((l) => l.entry.pk === faq), 60_000);
        await delivered(ctx.d1, translate);
        return "Dead letter after five refusals, and the edit behind it is applied. Requeue it (five more refusals) or discard it (the card goes back to the server's assignee) in device 1's outbox.";
      } },
    ],
  },
  {
    id: "move",
    title: "Move a card to another list",
    watch: "Alice moves a Design card to Ops: on her device it changes list; Bob is not on Ops, so it leaves his board (its old bucket sends a tombstone).",
    steps: [
      { label: "Move it", run: async (ctx) => {
        await ready(ctx);
        const card = await shared(ctx, "move", "Migrate the CI runners", "design");
        await ctx.d1.move(card, "ops");
        await delivered(ctx.d1, card);
        await gone(ctx.d2, card);
        return "On device 1 the card is in Ops; on Bob's device it left Design and shows nowhere.";
      } },
    ],
  },
  {
    id: "large-sync",
    title: "A large first sync",
    watch: "Device 2 joins the archive of tens of thousands of cards: the bar counts the entries against the server's total while you keep adding and ticking cards, which answer at once.",
    steps: [
      { label: "Join the archive on device 2", run: async (ctx, say) => {
        await ready(ctx);
        await ctx.d2.setArchive(true);
        say("Pulling the archive on device 2: keep editing, on either device.");
        await ctx.d2.waitFor("the archive", (x) => x.progress?.done && x.lists.get("archive")?.rows.length, 600_000);
        return "Done: the archive is on device 2. Leave it with the button under the archive list.";
      } },
    ],
  },
];
