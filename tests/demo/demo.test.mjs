// The demo page as a visitor uses it, in headless Chromium: the npm package (pkg/) loaded by the
// page from the real demo gateway, over real PostgreSQL. Each test clicks what a visitor clicks
// (a scenario's buttons, the network switches, a board's fields) and reads what the page shows,
// above all what the scenario tells the visitor to watch. Screenshots of the main states go to
// target/demo-screenshots/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { launch, close, visit, quiet, dev, step, watchLine, shoot, sql } from "./visitor.mjs";

before(launch);
after(close);

const text = (locator) => locator.textContent();
const pushRefusal = (p) => typeof p === "object" && /kizuna_push$/.test(p.url) && /status of 409/.test(p.text);

test("two devices side by side: each its own person, lists and checkpoint; people see different lists", async () => {
  const { context, page } = await visit();
  const [alice, bob] = [dev(page, 1), dev(page, 2)];
  assert.equal(await alice.root.locator("select.user").inputValue(), "alice");
  assert.equal(await bob.root.locator("select.user").inputValue(), "bob");
  await alice.card("Rotate the database password").waitFor();
  assert.match(await text(bob.list("ops")), /Bob is not on this list: the server's policy sends none of its cards/);
  assert.equal(await bob.list("ops").locator(".card").count(), 0, "Bob's device never holds an Ops card");
  assert.equal(await text(alice.fingerprint("launch")), await text(bob.fingerprint("launch")), "the same Launch on both");
  await shoot(page, "01-two-devices");

  await bob.root.locator("select.user").selectOption("carol");
  await bob.card("Rotate the database password").waitFor();
  assert.match(await text(bob.list("design")), /Carol is not on this list/);
  assert.equal(await bob.list("design").locator(".card").count(), 0);
  quiet(page);
  await context.close();
});

test("offline edits on both devices converge once both are back online", async () => {
  const { context, page } = await visit();
  const [one, two] = [dev(page, 1), dev(page, 2)];
  await page.click('.picker [data-scenario="converge"]');
  assert.match(await watchLine(page), /reconnected, both show both and the Launch fingerprints match/);
  await step(page, "converge", 0);
  for (const d of [one, two]) assert.equal(await d.switch.isChecked(), false, "the switch says offline");
  await one.card("Order the launch cake").locator(".badge.pending").waitFor();
  await two.card("Print the stickers").locator(".badge.pending").waitFor();
  assert.equal(await one.card("Print the stickers").count(), 0, "device 1 does not see device 2's offline card");
  assert.equal(await two.card("Order the launch cake").count(), 0);
  assert.match(await text(one.outbox), /1 pending/);
  assert.match(await text(one.outbox), /new card “Order the launch cake” in Launch\s*waiting for the network/);
  assert.notEqual(await text(one.fingerprint("launch")), await text(two.fingerprint("launch")));
  await shoot(page, "02-offline-edits");

  assert.match(await step(page, "converge", 1), /Converged/);
  for (const d of [one, two]) {
    for (const title of ["Order the launch cake", "Print the stickers"]) await d.card(title).waitFor();
    assert.match(await text(d.outbox), /Empty: every write has its verdict/);
  }
  assert.equal(await text(one.fingerprint("launch")), await text(two.fingerprint("launch")), "the Launch fingerprints match");
  assert.equal(sql("select count(*) from board_cards where title in ('Order the launch cake', 'Print the stickers')"), "2");
  await shoot(page, "03-converged");
  quiet(page);
  await context.close();
});

test("two devices edit different columns of one card: both edits survive", async () => {
  const { context, page } = await visit();
  await step(page, "columns", 0);
  assert.match(await step(page, "columns", 1), /Both survive/);
  for (const n of [1, 2]) {
    const card = dev(page, n).card("Print the posters in A3");
    await card.getByText("Matte paper, 200 copies").waitFor();
    // Applied once each: the insert and the two edits.
    await card.getByText("3 writes").waitFor();
  }
  assert.equal(sql("select notes || ' / ' || revision from board_cards where title = 'Print the posters in A3'"), "Matte paper, 200 copies / 3");
  quiet(page);
  await context.close();
});

test("both devices write one column: the later arrival wins and the loser is shown from the conflict journal", async () => {
  const { context, page } = await visit();
  await page.click('.picker [data-scenario="same-column"]');
  assert.match(await watchLine(page), /device 2 reconnects last, so its title wins everywhere \(arrival order\)/);
  await step(page, "same-column", 0);
  await step(page, "same-column", 1);
  for (const n of [1, 2]) {
    const d = dev(page, n);
    const card = d.card("Release name: Borealis");
    await card.locator(".conflict").getByText("⚔ title: “Release name: Aurora” lost to “Release name: Borealis”").waitFor();
    assert.equal(await d.card("Release name: Aurora").count(), 0);
    await d.feed.filter({ hasText: "Conflict on “Release name: Borealis”, title: “Release name: Aurora” lost to “Release name: Borealis”" }).first().waitFor();
    assert.equal(await d.feed.filter({ hasText: "Conflict" }).count(), 1, "one conflict, no other");
  }
  await shoot(page, "04-conflict");
  quiet(page);
  await context.close();
});

test("a delete against an offline edit: the edit is refused DELETE_WINS and the card goes", async () => {
  const { context, page } = await visit();
  const two = dev(page, 2);
  await step(page, "delete-wins", 0);
  await two.card("Order the banners").locator(".badge.pending").waitFor();
  assert.equal(await dev(page, 1).card("Order the banners").count(), 0, "gone on device 1");
  await step(page, "delete-wins", 1);
  const refusal = two.feed.filter({ hasText: "DELETE_WINS" });
  await refusal.first().waitFor();
  assert.match(await text(refusal.first()), /Server refused the edit of “Order the banners” \(notes\): DELETE_WINS, the row was deleted on the server; the server's row: none, the card is gone/);
  assert.equal(await two.card("Order the banners").count(), 0);
  assert.equal(sql("select count(*) from board_cards where title = 'Order the banners'"), "0");
  await shoot(page, "05-delete-wins");
  quiet(page);
  await context.close();
});

test("writes the gate or the policy refuses are rolled back with their reason", async () => {
  const { context, page } = await visit();
  const [one, two] = [dev(page, 1), dev(page, 2)];
  await step(page, "refused", 0);
  const gate = one.feed.filter({ hasText: "VALIDATION_FAILED" }).first();
  assert.match(await text(gate), /Server refused the edit of “Send the invitations” \(title\): VALIDATION_FAILED, the table's validation gate refused the row; back to the server's row/);
  await one.card("Send the invitations").waitFor();
  const policy = two.feed.filter({ hasText: "RLS_DENIED" }).first();
  assert.match(await text(policy), /Server refused the write of “Bob's card in Ops”: RLS_DENIED, .*the card is gone/);
  assert.equal(await two.list("ops").locator(".card").count(), 0);
  await two.feed.filter({ hasText: "Rolled back to the server's row: “Bob's card in Ops”" }).first().waitFor();
  await shoot(page, "06-refused");
  quiet(page);
  await context.close();
});

test("a poisoned write dead-letters after five refusals while other writes flow; requeued it fails again, discarded the card is restored", async () => {
  const { context, page } = await visit();
  const [one, two] = [dev(page, 1), dev(page, 2)];
  await page.click('.picker [data-scenario="dead-letter"]');
  assert.match(await watchLine(page), /five times with growing waits, then it is a dead letter and the edit behind it goes/);
  await page.locator('.scenario .step[data-step="0"]').click();
  const refused = one.outbox.locator('.write[data-state="refused"]');
  await refused.waitFor({ timeout: 30000 });
  assert.match(await text(refused), /“Update the FAQ”: assignee → Dave \(left the team\)\s*refused [1-4] of 5 times \(23503: a row it refers to does not exist, or others refer to it \(board_cards_assignee_fkey\)\)/);
  assert.match(await text(one.outbox.locator('.write[data-state="waiting"]')), /“Translate the FAQ”: done → “true”\s*waiting behind #\d+/);
  // Device 2's edit is not held up: it is applied while device 1's poisoned write is retried.
  await two.card("Translate the FAQ").getByText("Spanish first").waitFor();
  await page.waitForFunction(() => !document.querySelector("#device-2 .card.pending"));
  assert.equal(await refused.count(), 1, "still refused and retried on device 1");
  await shoot(page, "07-refused-and-retried");

  await page.locator('.scenario .state[data-tone="done"]').waitFor({ timeout: 60000 });
  const letter = one.outbox.locator(".write.dead-letter");
  assert.match(await text(letter), /“Update the FAQ”: assignee → Dave \(left the team\)\s*refused 5 times \(23503: a row it refers to does not exist, or others refer to it \(board_cards_assignee_fkey\)\)/);
  await one.feed.filter({ hasText: "Dead letter after 5 refusals" }).first().waitFor();
  assert.equal(await one.card("Translate the FAQ").locator("input.tick").isChecked(), true);
  assert.equal(sql("select done from board_cards where title = 'Translate the FAQ'"), "t", "the edit behind it went");
  assert.equal(sql("select coalesce(assignee, 'nobody') from board_cards where title = 'Update the FAQ'"), "nobody");
  await shoot(page, "08-dead-letter");

  await letter.getByRole("button", { name: "Requeue" }).click();
  await one.outbox.locator('.write[data-state="refused"]').waitFor();
  await one.outbox.locator(".write.dead-letter").waitFor({ timeout: 60000 });
  await one.outbox.locator(".write.dead-letter").getByRole("button", { name: "Discard" }).click();
  await one.outbox.getByText("Empty: every write has its verdict.").waitFor();
  await page.waitForFunction(() => ![...document.querySelectorAll("#device-1 .card")].some((c) => c.textContent.includes("Update the FAQ") && c.textContent.includes("Dave")));
  assert.equal(await one.card("Update the FAQ").locator(".assignee").count(), 0, "back to the server's row: nobody assigned");
  quiet(page, pushRefusal);
  // The browser logs each refused push: five for the poisoned write alone and five after the
  // requeue, and one more when its first push also carried the edit made after it (a slice of
  // two that is refused is not charged: it is cut to its head write and sent again).
  const logged = page.problems.filter(pushRefusal).length;
  assert.ok(logged === 10 || logged === 11, `the browser logged the refused pushes and nothing else: ${logged}`);
  await context.close();
});

test("a card moved to another list changes bucket: it leaves the board of a person not on that list", async () => {
  const { context, page } = await visit();
  const [one, two] = [dev(page, 1), dev(page, 2)];
  await step(page, "move", 0);
  await one.list("ops").locator(".card").filter({ hasText: "Migrate the CI runners" }).waitFor();
  assert.equal(await one.list("design").locator(".card").filter({ hasText: "Migrate the CI runners" }).count(), 0);
  assert.equal(await two.card("Migrate the CI runners").count(), 0, "gone from Bob's board");
  await two.root.locator("select.user").selectOption("carol");
  await two.list("ops").locator(".card").filter({ hasText: "Migrate the CI runners" }).waitFor();
  quiet(page);
  await context.close();
});

test("a large first sync shows its progress against the server's total while the page answers at once", async () => {
  const { context, page } = await visit();
  const [one, two] = [dev(page, 1), dev(page, 2)];
  const archived = Number(sql("select count(*) from board_cards where list = 'archive'"));
  await page.click('.picker [data-scenario="large-sync"]');
  // Records every state of the bar, and whether a card added meanwhile showed before it finished.
  await page.evaluate(() => {
    window.bar = [];
    new MutationObserver(() => {
      const label = document.querySelector("#device-2 .progress .label")?.textContent;
      if (label && window.bar.at(-1) !== label) window.bar.push(label);
      if (!window.addedWhile && [...document.querySelectorAll("#device-2 .card .title")].some((t) => t.textContent === "Added during the sync")) {
        window.addedWhile = label;
      }
    }).observe(document.getElementById("device-2"), { subtree: true, childList: true, characterData: true });
  });
  await page.locator('.scenario .step[data-step="0"]').click();
  await two.progress.getByText(/^Pulling [\d,]+ of [\d,]+ entries/).waitFor();
  await shoot(page, "09-large-sync");
  await two.list("launch").locator("input[name=title]").fill("Added during the sync");
  await two.list("launch").locator("input[name=title]").press("Enter");
  await one.card("Book the demo room").locator("input.tick").click();
  await two.progress.getByText(/^✓ Pulled/).waitFor({ timeout: 300000 });
  const bar = await page.evaluate(() => window.bar);
  const partial = bar.map((l) => l.match(/^Pulling ([\d,]+) of ([\d,]+) entries \((\d+)%\)$/)).filter(Boolean);
  assert.ok(partial.some((m) => m[3] !== "0" && m[3] !== "100"), `the bar moved through its run: ${bar.join(" | ")}`);
  const total = Number(partial[0][2].replaceAll(",", ""));
  assert.ok(total >= archived, `the server's total (${total}) counts the archive (${archived})`);
  assert.match(await page.evaluate(() => window.addedWhile ?? "after"), /^Pulling/, "the card added during the sync showed while it ran");
  await two.list("archive").locator(".count").getByText(`${archived.toLocaleString("en-US")} cards`, { exact: true }).waitFor();
  assert.match(await text(two.list("archive").locator(".more")), /^and [\d,]+ more$/);
  await shoot(page, "10-large-sync-done");
  await two.list("archive").getByRole("button", { name: "Leave the archive" }).click();
  await page.waitForFunction(() => document.querySelector('#device-2 .list[data-list="archive"] .count').textContent === "0 cards");
  quiet(page);
  await context.close();
});

test("a reload with writes pending: still pending after it, then delivered once", async () => {
  const { context, page } = await visit();
  const one = dev(page, 1);
  await one.switch.click();
  await one.list("launch").locator("input[name=title]").fill("Written before the reload");
  await one.list("launch").locator("input[name=title]").press("Enter");
  await one.card("Written before the reload").locator("input.tick").click();
  await page.waitForFunction(() => document.querySelectorAll('#device-1 .write[data-state="queued"]').length === 2);
  await page.reload();
  await page.waitForSelector("body[data-ready=yes]");
  await one.card("Written before the reload").locator(".badge.pending").waitFor();
  assert.equal(await one.switch.isChecked(), false, "still offline after the reload");
  assert.match(await text(one.outbox), /2 pending/);
  assert.equal(sql("select count(*) from board_cards where title = 'Written before the reload'"), "0", "nothing reached the server");
  await one.switch.click();
  await one.outbox.getByText("Empty: every write has its verdict.").waitFor({ timeout: 30000 });
  await one.card("Written before the reload").getByText("2 writes").waitFor({ timeout: 30000 });
  assert.equal(sql("select revision || ' ' || done from board_cards where title = 'Written before the reload'"), "2 true", "each write applied once");
  quiet(page);
  await context.close();
});

test("the page in a second tab joins the same local databases: one tab runs each device's sync", async () => {
  const { context, page } = await visit();
  const { page: second } = await visit({ context });
  for (const p of [page, second]) await p.locator("#device-1 dd.leader").waitFor();
  const leads = async (p) => text(p.locator("#device-1 dd.leader"));
  await page.waitForFunction(() => document.querySelector("#device-1 dd.leader").textContent === "runs this device's sync");
  assert.equal(await leads(second), "follows the tab that runs it");
  await dev(second, 1).list("launch").locator("input[name=title]").fill("Written in the second tab");
  await dev(second, 1).list("launch").locator("input[name=title]").press("Enter");
  await dev(page, 1).card("Written in the second tab").waitFor();
  await dev(second, 1).card("Written in the second tab").getByText("1 write").waitFor({ timeout: 30000 });
  await dev(page, 1).switch.click();
  await page.waitForFunction(() => document.querySelector("#device-1").classList.contains("offline"));
  await second.waitForFunction(() => document.querySelector("#device-1 input.online").checked === false);
  quiet(page);
  quiet(second);
  await context.close();
});

test("on a phone-width window the page fits and stays usable", async () => {
  const { context, page } = await visit({ width: 390, height: 844 });
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), "nothing wider than the window");
  await step(page, "refused", 0);
  await shoot(page, "11-phone", { fullPage: false });
  quiet(page);
  await context.close();
});
