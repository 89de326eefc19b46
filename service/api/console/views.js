// The catalog, scenario and live-sessions views, all over the public v1 API (the session page is session.js).
import { get, post } from "./api.js";
import { errorBox, h, tree } from "./dom.js";
import { highlight } from "./highlight.js";
import { toolCard } from "./schema.js";
import { OPENING } from "./session.js";

const enc = encodeURIComponent;

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
  const name = envId.split("@")[0]; // (envId may name one version: env_id@<label or digest prefix>)
  const [env, first, versions] = await Promise.all([get(`/v1/environments/${enc(envId)}`),
    get(`/v1/environments/${enc(name)}/scenarios?limit=${SCENARIO_PAGE}`),
    get(`/v1/environments/${enc(name)}/versions`)]);
  main.append(h("h2", {}, env.env_id), h("p", {}, env.summary),
    h("p", { class: "muted" }, `Class ${env.class_name}. Version ${short(env.version)}${env.label ? ` (${env.label})` : ""}.`),
    versionSection(env, versions.versions),
    h("section", { "aria-labelledby": "intro-h" }, h("h3", { id: "intro-h" }, "Introduction"), h("p", { class: "prose" }, env.introduction)),
    h("section", { "aria-labelledby": "rules-h" }, h("h3", { id: "rules-h" }, "Rules"),
      h("ul", {}, (Array.isArray(env.rules) ? env.rules : [env.rules]).map((r) => h("li", {}, r)))),
    scenarioSection(first),
    h("section", { "aria-labelledby": "tools-h" }, h("h3", { id: "tools-h" }, `Tools (${env.tools.length})`),
      env.tools.map(toolCard)),
    env.provenance ? provenanceSection(env.provenance) : null,
    h("section", { "aria-labelledby": "source-h" }, h("h3", { id: "source-h" }, "Class source"),
      h("details", { class: "source" }, h("summary", {}, `${env.class_name} (${env.source.split("\n").length} lines)`),
        h("pre", {}, h("code", { class: "python" }, highlight(env.source))))));
}

const short = (version) => version.slice(0, 12);

// Every version of the id: pick one to see it, and what each changed in the tools.
function versionSection(env, versions) {
  const pick = h("select", { id: "version", onchange: (e) => { location.hash = `#/env/${enc(`${env.env_id}@${e.target.value}`)}`; } },
    versions.map((v) => h("option", { value: short(v.version), selected: v.version === env.version },
      `${short(v.version)}${v.label ? ` ${v.label}` : ""}${v.latest ? " (latest)" : ""}`)));
  const changed = (c) => [["added", c.added], ["removed", c.removed], ["changed", c.changed]]
    .filter(([, names]) => names.length).map(([kind, names]) => `${kind} ${names.join(", ")}`).join("; ") || "no tool changes";
  return h("section", { "aria-labelledby": "versions-h" }, h("h3", { id: "versions-h" }, `Versions (${versions.length})`),
    h("form", { class: "inline" }, h("label", { for: "version" }, "Version "), pick),
    h("ol", { class: "versions" }, versions.map((v) => h("li", {}, h("code", {}, short(v.version)), v.label ? ` ${v.label}` : "",
      v.latest ? " (latest)" : "", h("span", { class: "muted" }, ` — ${changed(v.changes)}`)))));
}

// Thousands of scenarios in one environment (an imported benchmark): a page at a time, following `next`.
const SCENARIO_PAGE = 100;

function scenarioCard(s) {
  const labels = [s.split, ...(s.tags ?? [])].filter(Boolean).join(" · ");
  return h("li", {}, h("h4", {}, h("a", { href: `#/scenario/${enc(s.scenario_id)}` }, s.scenario_id)),
    labels ? h("p", { class: "muted" }, labels) : null, h("p", {}, s.task));
}

function scenarioSection(first) {
  const list = h("ul", { class: "cards" }, first.scenarios.map(scenarioCard));
  const more = h("button", { type: "button" }, "Show more");
  const out = h("div", {});
  let next = first.next;
  const shown = () => `Showing ${list.children.length} of ${first.total}.`;
  const status = h("p", { class: "muted", "aria-live": "polite" }, shown());
  more.hidden = !next;
  more.addEventListener("click", async () => {
    more.disabled = true;
    out.replaceChildren();
    try {
      const page = await get(next);
      list.append(...page.scenarios.map(scenarioCard));
      next = page.next;
      more.hidden = !next;
      status.textContent = shown();
    } catch (e) { out.append(errorBox(e)); }
    more.disabled = false;
  });
  return h("section", { "aria-labelledby": "scen-h" }, h("h3", { id: "scen-h" }, `Scenarios (${first.total})`),
    list, status, more, out);
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
