// The session page: task and score beside tabs for the tools, the state and the trajectory. Each tool
// form shows what its last call did (outcome, result, state diff) right under it.
import { del, get, post } from "./api.js";
import { errorBox, h, json, status, tree } from "./dom.js";
import { toolForm } from "./schema.js";

const enc = encodeURIComponent;
export const OPENING = "envfoundry.opening.";

// A call that ran is ok; one whose tool said no (EnvScaler's {"success": false, ...}) is a refusal,
// shown as one: an agent reading a green tick would take it for done.
export function outcome(step) {
  if (!step.ok) return { cls: "failed", mark: "✗ failed", text: step.error ? `${step.error.type}: ${step.error.message}` : "failed" };
  const r = step.result;
  if (r && typeof r === "object" && !Array.isArray(r) && r.success === false) {
    return { cls: "refused", mark: "⊘ refused", text: typeof r.error === "string" ? r.error : JSON.stringify(r.error ?? r.message ?? "") };
  }
  return { cls: "ok", mark: "✓ ok", text: "" };
}

function diffView(diff) {
  if (!diff) return "";
  if (diff.truncated) return h("p", { class: "muted" }, `diff of ${diff.bytes} bytes not recorded`);
  const line = (cls, sign, entry) => h("li", { class: cls }, `${sign} ${entry.path ?? ""} `,
    "old" in entry ? h("span", { class: "old" }, JSON.stringify(entry.old)) : "",
    "old" in entry && "new" in entry ? " → " : "",
    "new" in entry ? h("span", { class: "new" }, JSON.stringify(entry.new)) : "",
    !("old" in entry) && !("new" in entry) && "value" in entry ? JSON.stringify(entry.value) : "",
    !("old" in entry) && !("new" in entry) && !("value" in entry) ? JSON.stringify(entry) : "");
  const items = [...diff.added.map((e) => line("added", "+", e)), ...diff.removed.map((e) => line("removed", "−", e)),
    ...diff.changed.map((e) => line("changed", "~", e))];
  return items.length ? h("ul", { class: "diff", "aria-label": "state diff" }, items) : h("p", { class: "muted" }, "no state change");
}

// ``forkHere(step)`` makes a new session at the state after that step (the button on each step).
function stepView(step, forkHere) {
  const here = h("button", { type: "button", class: "fork-here", title: `a new session at the state after step ${step.step}`,
    onclick: () => forkHere(step.step) }, "Fork here");
  if (step.kind === "message") {
    return h("li", { class: "step message" }, h("h4", {}, `#${step.step} message `, here),
      h("p", {}, h("strong", {}, "Agent: "), step.content), h("p", {}, h("strong", {}, "User: "), step.reply),
      step.done ? h("p", { class: "muted" }, "the user ended the conversation") : "");
  }
  if (step.kind === "turn") { // the end of a turn of a turn-based episode, with its checks as they ran then
    const passed = step.checks.filter((c) => c.passed).length;
    return h("li", { class: "step turn" }, h("h4", {}, `#${step.step} end of turn ${step.turn + 1} `, here),
      step.content ? h("p", {}, h("strong", {}, "Agent: "), step.content) : "",
      h("p", { class: "muted" }, `${passed} of ${step.checks.length} checks passed${step.done ? "; the last turn" : ""}`));
  }
  const o = outcome(step);
  return h("li", { class: `step ${o.cls}` },
    h("h4", {}, `#${step.step} `, h("code", {}, step.name), ` ${o.mark} `, here),
    h("details", {}, h("summary", {}, "arguments"), json(step.arguments)),
    step.ok ? h("details", {}, h("summary", {}, "result"), json(step.result)) : "",
    o.text ? h("p", { class: o.cls === "failed" ? "error" : "refusal" }, o.text) : "",
    diffView(step.diff));
}

// What one call did, shown beside the form that made it.
function lastCall(step) {
  const o = outcome(step);
  return h("div", { class: `last-call ${o.cls}` },
    h("p", {}, h("strong", {}, `Step #${step.step}: ${o.mark}`), o.text ? ` — ${o.text}` : ""),
    step.ok ? json(step.result) : "", diffView(step.diff));
}

function scoreView(score) {
  if (score.reward === null) return [h("p", { class: "muted" }, "No checks: this session has no scenario to score against.")];
  return [h("p", { class: "reward" }, `Reward ${score.reward.toFixed(2)} (${score.passed}/${score.total})`),
    h("ul", { class: "checks" }, score.checks.map((c) => h("li", { class: c.passed ? "passed" : "failed" },
      c.passed ? "✓ passed: " : "✗ failed: ", c.item, c.error ? h("span", { class: "error" }, ` — ${c.error}`) : "")))];
}

// WAI-ARIA tabs: one panel shown at a time, arrow keys move between tabs.
function tabs(label, entries) {
  const list = h("div", { role: "tablist", "aria-label": label, class: "tabs" });
  const panels = [];
  const buttons = entries.map(([id, title, content], i) => {
    const panel = h("div", { role: "tabpanel", id: `${id}-panel`, "aria-labelledby": `${id}-tab`, class: "tab-panel",
      hidden: i !== 0 }, content);
    panels.push(panel);
    return h("button", { type: "button", role: "tab", id: `${id}-tab`, "aria-controls": `${id}-panel`,
      "aria-selected": String(i === 0), tabindex: i === 0 ? 0 : -1 }, title);
  });
  const select = (i) => buttons.forEach((b, j) => {
    b.setAttribute("aria-selected", String(i === j));
    b.tabIndex = i === j ? 0 : -1;
    panels[j].hidden = i !== j;
  });
  buttons.forEach((b, i) => {
    b.addEventListener("click", () => select(i));
    b.addEventListener("keydown", (e) => {
      const next = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: buttons.length - 1 }[e.key];
      if (next === undefined) return;
      e.preventDefault();
      const j = (next + buttons.length) % buttons.length;
      select(j);
      buttons[j].focus();
    });
  });
  list.append(...buttons);
  return { node: h("div", { class: "tabbed" }, list, panels), buttons };
}

export async function sessionView(main, sessionId) {
  const base = `/v1/sessions/${enc(sessionId)}`;
  const [info, { tools }] = await Promise.all([get(base), get(`${base}/tools`)]);
  const scenario = info.scenario_id ? await get(`/v1/scenarios/${enc(info.scenario_id)}`).catch(() => null) : null;
  const stateBox = h("div", { class: "state" });
  const timeline = h("ol", { class: "timeline", "aria-label": "trajectory" });
  const scoreBox = h("div", { class: "score", "aria-live": "polite" });
  const actions = h("div", { class: "actions" });
  const steps = new Map();
  let shown = 0;
  let trajectoryTab = null;

  // A fork at the current step (null) or at a past one, opened at once.
  async function forkAt(step) {
    try {
      const forked = await post(`${base}/fork`, step === null ? { n: 1 } : { n: 1, step });
      location.hash = `#/session/${enc(forked.session_ids?.[0] ?? forked.session_id)}`;
    } catch (e) { actions.append(errorBox(e)); }
  }

  async function refresh() {
    const view = await get(`${base}/state`);
    stateBox.replaceChildren(tree(view.state, "", "state"));
    for (;;) {
      const page = await get(`${base}/trajectory?offset=${shown}&limit=50`);
      for (const step of page.steps) {
        steps.set(step.step, step);
        timeline.append(stepView(step, forkAt));
        if (step.kind === "message") {
          chat.append(h("li", { class: "msg assistant" }, h("strong", {}, "You: "), step.content),
            h("li", { class: "msg user" }, h("strong", {}, "User: "), step.reply));
        }
      }
      shown += page.steps.length;
      if (!page.steps.length || shown >= page.total) break;
    }
    if (trajectoryTab) trajectoryTab.textContent = `Trajectory (${shown})`;
    scoreBox.replaceChildren(...scoreView(await post(`${base}/score`)));
  }

  const call = async (name, args) => {
    const answer = await post(`${base}/calls`, { name, arguments: args });
    status(`${name}: ${outcome(answer).mark}`);
    await refresh();
    return lastCall(steps.get(answer.step) ?? answer); // the trajectory's record carries the diff
  };

  const conversation = h("div");
  const chat = h("ol", { class: "messages", "aria-label": "conversation" });
  if (info.mode === "conversation") {
    const opening = sessionStorage.getItem(`${OPENING}${sessionId}`);
    if (opening) chat.append(h("li", { class: "msg user" }, h("strong", {}, "User: "), opening));
    const input = h("textarea", { id: "message", rows: 3 });
    conversation.append(chat, h("form", { onsubmit: async (e) => {
      e.preventDefault();
      try { await post(`${base}/messages`, { content: input.value }); input.value = ""; await refresh(); }
      catch (err) { conversation.append(errorBox(err)); }
    } }, h("label", { for: "message" }, "Message to the user"), input, h("button", { type: "submit" }, "Send")));
  }

  const fork = h("button", { type: "button", onclick: () => forkAt(null) }, "Fork");
  const remove = h("button", { type: "button", class: "danger", onclick: async () => {
    // Deleting cannot be undone, and forks of this session stay alive: say both before doing it.
    if (!window.confirm(`Delete session ${sessionId}? Its state and trajectory are gone for good; its forks stay.`)) return;
    try { await del(base); status(`session ${sessionId} deleted`); location.hash = "#/sessions"; }
    catch (e) { actions.append(errorBox(e)); }
  } }, "Delete");
  actions.append(fork, " ", remove);

  const tabbed = tabs("Session", [
    ["tools", `Tools (${tools.length})`, tools.map((t) => toolForm(t, call))],
    ["state", "State", stateBox],
    ["trajectory", "Trajectory", timeline]]);
  trajectoryTab = tabbed.buttons[2];

  main.append(h("h2", {}, "Session ", h("code", {}, sessionId)),
    h("p", { class: "muted" }, `${info.env_id} · ${info.scenario_id ?? "no scenario"} · ${info.mode} · expires ${info.expires_at}`,
      info.parent_id ? h("span", {}, " · forked from ", h("a", { href: `#/session/${enc(info.parent_id)}` }, info.parent_id)) : ""),
    actions,
    h("div", { class: "session-grid" },
      h("div", { class: "side" },
        h("section", { "aria-labelledby": "task-h", class: "panel" }, h("h3", { id: "task-h" }, info.mode === "conversation" ? "Conversation" : "Task"),
          // In conversation mode the task is the simulated user's hidden goal: the person playing sees the chat only.
          info.mode === "conversation" ? "" : h("p", { class: "prose" }, scenario?.task ?? ""), conversation),
        h("section", { "aria-labelledby": "score-h", class: "panel" }, h("h3", { id: "score-h" }, "Score"), scoreBox)),
      h("section", { "aria-label": "Tools, state and trajectory", class: "panel work" }, tabbed.node)));
  await refresh();
}
