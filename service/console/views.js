// The catalog, session and live-sessions views, all over the public v1 API.
import { del, get, post } from "./api.js";
import { errorBox, h, json, status, tree } from "./dom.js";
import { highlight } from "./highlight.js";
import { fn, toolCard, toolForm } from "./schema.js";

const enc = encodeURIComponent;
const OPENING = "envfoundry.opening.";

export async function catalogView(main) {
  const { environments } = await get("/v1/environments");
  main.append(h("h2", {}, "Environments"),
    environments.length ? h("ul", { class: "cards" }, environments.map((e) => h("li", {},
      h("h3", {}, h("a", { href: `#/env/${enc(e.env_id)}` }, e.env_id)),
      h("p", {}, e.summary),
      h("p", { class: "muted" }, `${e.tool_count} tools · ${e.scenario_count} scenarios · class ${e.class_name}`))))
      : h("p", {}, "No environments."));
}

export async function environmentView(main, envId) {
  const [env, { scenarios }] = await Promise.all([get(`/v1/environments/${enc(envId)}`),
    get(`/v1/environments/${enc(envId)}/scenarios`)]);
  main.append(h("h2", {}, env.env_id), h("p", {}, env.summary),
    h("p", { class: "muted" }, `Class ${env.class_name}.`),
    h("section", { "aria-labelledby": "intro-h" }, h("h3", { id: "intro-h" }, "Introduction"), h("p", { class: "prose" }, env.introduction)),
    h("section", { "aria-labelledby": "rules-h" }, h("h3", { id: "rules-h" }, "Rules"),
      h("ul", {}, (Array.isArray(env.rules) ? env.rules : [env.rules]).map((r) => h("li", {}, r)))),
    h("section", { "aria-labelledby": "scen-h" }, h("h3", { id: "scen-h" }, `Scenarios (${scenarios.length})`),
      h("ul", { class: "cards" }, scenarios.map((s) => h("li", {},
        h("h4", {}, h("a", { href: `#/scenario/${enc(s.scenario_id)}` }, s.scenario_id)), h("p", {}, s.task))))),
    h("section", { "aria-labelledby": "tools-h" }, h("h3", { id: "tools-h" }, `Tools (${env.tools.length})`),
      env.tools.map(toolCard)),
    env.provenance ? provenanceSection(env.provenance) : null,
    h("section", { "aria-labelledby": "source-h" }, h("h3", { id: "source-h" }, "Class source"),
      h("details", { class: "source" }, h("summary", {}, `${env.class_name} (${env.source.split("\n").length} lines)`),
        h("pre", {}, h("code", { class: "python" }, highlight(env.source))))));
}

// What synthesis recorded: its assessment of the tools, and what it repaired or removed.
function provenanceSection(provenance) {
  const a = provenance.assessment ?? {};
  const row = (name, value) => h("tr", {}, h("th", { scope: "row" }, name), h("td", {}, value));
  const counts = (c) => Object.entries(c ?? {}).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
  return h("section", { "aria-labelledby": "prov-h" }, h("h3", { id: "prov-h" }, "Assessment (from synthesis)"),
    h("table", {}, h("tbody", {}, row("Rounds", String(a.rounds ?? "?")), row("Verdicts", counts(a.counts)),
      row("Before repair", counts(a.first_counts)), row("Repaired tools", (a.repaired ?? []).join(", ") || "none"),
      row("Removed tools", (a.removed ?? []).join(", ") || "none"), row("Ratio", String(a.ratio ?? "?")))));
}

async function startSession(scenarioId, mode, out) {
  out.replaceChildren();
  try {
    const created = await post("/v1/sessions", { scenario_id: scenarioId, n: 1, mode });
    // The simulated user's opening line comes only with the creation response: keep it for the session view.
    if (created.user_message) sessionStorage.setItem(`${OPENING}${created.session_id}`, created.user_message);
    location.hash = `#/session/${enc(created.session_id)}`;
  } catch (e) { out.append(errorBox(e)); }
}

export async function scenarioView(main, scenarioId) {
  const s = await get(`/v1/scenarios/${enc(scenarioId)}`);
  const out = h("div");
  const mode = h("select", { id: "mode" }, h("option", { value: "task" }, "task"),
    h("option", { value: "conversation" }, "conversation (simulated user)"));
  main.append(h("h2", {}, `Scenario ${s.scenario_id}`),
    h("p", {}, "Environment ", h("a", { href: `#/env/${enc(s.env_id)}` }, s.env_id)),
    h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); startSession(s.scenario_id, mode.value, out); } },
      h("label", { for: "mode" }, "Mode "), mode, h("button", { type: "submit" }, "Create session")), out,
    h("section", { "aria-labelledby": "task-h" }, h("h3", { id: "task-h" }, "Task"), h("p", { class: "prose" }, s.task)),
    h("section", { "aria-labelledby": "check-h" }, h("h3", { id: "check-h" }, "Checklist"),
      h("ol", {}, s.checklist.map((c) => h("li", {}, c.item ?? JSON.stringify(c))))),
    h("section", { "aria-labelledby": "ref-h" }, h("h3", { id: "ref-h" }, "Reference solution"),
      h("ol", {}, (s.reference_solution ?? []).map((c) => h("li", {}, h("code", {}, c.name), " ", JSON.stringify(c.arguments))))),
    h("section", { "aria-labelledby": "init-h" }, h("h3", { id: "init-h" }, "Initial state"), tree(s.init_config, "", "init")));
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

function stepView(step) {
  if (step.kind === "message") {
    return h("li", { class: "step message" }, h("h4", {}, `#${step.step} message`),
      h("p", {}, h("strong", {}, "Agent: "), step.content), h("p", {}, h("strong", {}, "User: "), step.reply),
      step.done ? h("p", { class: "muted" }, "the user ended the conversation") : "");
  }
  return h("li", { class: `step ${step.ok ? "ok" : "failed"}` },
    h("h4", {}, `#${step.step} `, h("code", {}, step.name), step.ok ? " ✓" : " ✗ failed"),
    h("details", {}, h("summary", {}, "arguments"), json(step.arguments)),
    step.ok ? h("details", {}, h("summary", {}, "result"), json(step.result))
      : h("p", { class: "error" }, step.error ? `${step.error.type}: ${step.error.message}` : "failed"),
    diffView(step.diff));
}

function scoreView(score) {
  return [h("p", { class: "reward" }, `Reward ${score.reward.toFixed(2)} (${score.passed}/${score.total})`),
    h("ul", { class: "checks" }, score.checks.map((c) => h("li", { class: c.passed ? "passed" : "failed" },
      c.passed ? "✓ passed: " : "✗ failed: ", c.item, c.error ? h("span", { class: "error" }, ` — ${c.error}`) : "")))];
}

export async function sessionView(main, sessionId) {
  const base = `/v1/sessions/${enc(sessionId)}`;
  const [info, { tools }] = await Promise.all([get(base), get(`${base}/tools`)]);
  const scenario = info.scenario_id ? await get(`/v1/scenarios/${enc(info.scenario_id)}`).catch(() => null) : null;
  const stateBox = h("div", { class: "state" });
  const timeline = h("ol", { class: "timeline", "aria-label": "trajectory" });
  const scoreBox = h("div", { class: "score", "aria-live": "polite" });
  const actions = h("div");
  let shown = 0;

  async function refresh() {
    const view = await get(`${base}/state`);
    stateBox.replaceChildren(tree(view.state, "", "state"));
    for (;;) {
      const page = await get(`${base}/trajectory?offset=${shown}&limit=50`);
      for (const step of page.steps) {
        timeline.append(stepView(step));
        if (step.kind === "message") {
          chat.append(h("li", { class: "msg assistant" }, h("strong", {}, "You: "), step.content),
            h("li", { class: "msg user" }, h("strong", {}, "User: "), step.reply));
        }
      }
      shown += page.steps.length;
      if (!page.steps.length || shown >= page.total) break;
    }
    scoreBox.replaceChildren(...scoreView(await post(`${base}/score`)));
  }

  const call = async (name, args) => {
    const result = await post(`${base}/calls`, { name, arguments: args });
    status(result.ok ? `${name} succeeded` : `${name} failed: ${result.error?.message ?? ""}`);
    await refresh();
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

  const fork = h("button", { type: "button", onclick: async () => {
    try {
      const forked = await post(`${base}/fork`, { n: 1 });
      location.hash = `#/session/${enc(forked.session_ids?.[0] ?? forked.session_id)}`;
    } catch (e) { actions.append(errorBox(e)); }
  } }, "Fork");
  const remove = h("button", { type: "button", class: "danger", onclick: async () => {
    try { await del(base); status(`session ${sessionId} deleted`); location.hash = "#/sessions"; }
    catch (e) { actions.append(errorBox(e)); }
  } }, "Delete");
  actions.append(fork, " ", remove);

  main.append(h("h2", {}, "Session ", h("code", {}, sessionId)),
    h("p", { class: "muted" }, `${info.env_id} · ${info.scenario_id ?? "no scenario"} · ${info.mode} · expires ${info.expires_at}`,
      info.parent_id ? h("span", {}, " · forked from ", h("a", { href: `#/session/${enc(info.parent_id)}` }, info.parent_id)) : ""),
    actions,
    h("div", { class: "session-grid" },
      h("section", { "aria-labelledby": "task-h", class: "panel" }, h("h3", { id: "task-h" }, info.mode === "conversation" ? "Conversation" : "Task"),
        // In conversation mode the task is the simulated user's hidden goal: the person playing sees the chat only.
        info.mode === "conversation" ? "" : h("p", { class: "prose" }, scenario?.task ?? ""), conversation),
      h("section", { "aria-labelledby": "score-h", class: "panel" }, h("h3", { id: "score-h" }, "Score"), scoreBox),
      h("section", { "aria-labelledby": "tools-h", class: "panel" }, h("h3", { id: "tools-h" }, "Tools"),
        tools.map((t) => toolForm(t, call))),
      h("section", { "aria-labelledby": "state-h", class: "panel" }, h("h3", { id: "state-h" }, "State"), stateBox),
      h("section", { "aria-labelledby": "traj-h", class: "panel wide" }, h("h3", { id: "traj-h" }, "Trajectory"), timeline)));
  await refresh();
}

export async function sessionsView(main) {
  const page = await get("/v1/sessions?limit=200");
  const now = Date.now();
  const age = (t) => `${Math.max(0, Math.round((now - Date.parse(t)) / 1000))} s`;
  main.append(h("h2", {}, `Live sessions (${page.total})`),
    page.sessions.length ? h("div", { class: "scroll" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Session", "Environment", "Scenario", "Mode", "Age", "Steps", "Expires"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, page.sessions.map((s) => h("tr", {},
        h("td", {}, h("a", { href: `#/session/${enc(s.session_id)}` }, s.session_id)), h("td", {}, s.env_id),
        h("td", {}, s.scenario_id ?? ""), h("td", {}, s.mode), h("td", {}, age(s.created_at)), h("td", {}, String(s.steps)),
        h("td", {}, s.expires_at)))))) : h("p", {}, "No live sessions."));
}
