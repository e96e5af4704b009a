// The scenario picker and the banner of the chosen scenario: what to watch, its steps as buttons
// (each enabled in turn), and what the last step did.
import { h } from "./dom.js";
import { SCENARIOS } from "./scenarios.js";

export function mountScenarios(root, devices) {
  let chosen = SCENARIOS[0];
  let next = 0;           // the step to run next
  let running = false;
  let ctx = { ...devices };
  const picker = h("nav", { class: "picker", "aria-label": "Scenarios" });
  const banner = h("div", { class: "scenario", "aria-live": "polite" });

  const say = (text, tone = "info") => {
    const state = banner.querySelector(".state");
    state.textContent = text;
    state.dataset.tone = tone;
  };

  async function run(i) {
    running = true;
    render();
    say(`${chosen.steps[i].label}…`, "busy");
    try {
      const done = await chosen.steps[i].run(ctx, (text) => say(text, "busy"));
      next = (i + 1) % chosen.steps.length;
      if (next === 0) ctx = { ...devices };
      say(done, "done");
    } catch (e) {
      next = 0;
      ctx = { ...devices };
      say(`⚠ ${e.message}`, "bad");
    }
    running = false;
    render();
  }

  function choose(scenario) {
    if (running || scenario === chosen) return;
    chosen = scenario;
    next = 0;
    ctx = { ...devices };
    render();
    say("");
  }

  function render() {
    picker.replaceChildren(...SCENARIOS.map((s, i) => h("button", {
      type: "button", class: s === chosen ? "chosen" : "", dataset: { scenario: s.id }, disabled: running && s !== chosen,
      "aria-pressed": String(s === chosen), onclick: () => choose(s) }, `${i + 1}. ${s.title}`)));
    const state = banner.querySelector(".state") ?? h("p", { class: "state" });
    banner.dataset.scenario = chosen.id;
    banner.replaceChildren(
      h("h2", {}, chosen.title),
      h("p", { class: "watch" }, h("strong", {}, "Watch: "), chosen.watch),
      h("div", { class: "steps" }, chosen.steps.map((step, i) => h("button", {
        type: "button", class: "step", dataset: { step: i }, disabled: running || i !== next, onclick: () => run(i) },
        `${i + 1}. ${step.label}`))),
      state);
  }

  root.replaceChildren(picker, banner);
  render();
}
