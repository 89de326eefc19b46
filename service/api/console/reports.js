// Reports read from local files (nothing is uploaded): a rollout JSONL and an `envfoundry synth` output folder.
import { errorBox, h, json, s } from "./dom.js";

const enc = encodeURIComponent;

export function parseJsonl(text, name) {
  const out = [];
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    try { out.push(JSON.parse(line)); } catch { throw new Error(`${name} line ${i + 1}: not JSON`); }
  });
  return out;
}

// A horizontal bar chart: rows of {label, parts: [{value, cls, name}]}, scaled to max.
export function barChart(title, rows, max, format = (v) => String(v)) {
  const rowH = 26, labelW = 180, barW = 300, width = labelW + barW + 70;
  const svg = s("svg", { viewBox: `0 0 ${width} ${rows.length * rowH + 8}`, role: "img", class: "chart",
    "aria-label": title });
  svg.append(s("title", {}, title));
  rows.forEach((row, i) => {
    const y = i * rowH + 4;
    svg.append(s("text", { x: labelW - 6, y: y + 16, "text-anchor": "end" }, row.label));
    let x = labelW;
    for (const part of row.parts) {
      const w = max > 0 ? (part.value / max) * barW : 0;
      svg.append(s("rect", { x, y, width: Math.max(w, 0), height: rowH - 8, class: part.cls },
        s("title", {}, `${row.label} ${part.name}: ${format(part.value)}`)));
      x += w;
    }
    svg.append(s("text", { x: x + 6, y: y + 16 }, row.parts.map((p) => format(p.value)).join(" / ")));
  });
  return h("figure", {}, svg, h("figcaption", {}, title));
}

function messageView(m) {
  const calls = (m.tool_calls ?? []).map((c) => h("div", { class: "call" }, "→ ", h("code", {}, c.function?.name ?? "?"), " ",
    c.function?.arguments ?? ""));
  return h("li", { class: `msg ${m.role}` }, h("strong", {}, m.role, m.name ? ` (${m.name})` : "", ": "),
    m.content == null ? "" : h("span", { class: "prose" }, typeof m.content === "string" ? m.content : JSON.stringify(m.content)), calls);
}

export function rolloutView(main) {
  const input = h("input", { type: "file", id: "rollout-file", accept: ".jsonl,.json,application/json" });
  const out = h("div");
  input.addEventListener("change", async () => {
    out.replaceChildren();
    const file = input.files?.[0];
    if (!file) return;
    try { out.append(...rolloutReport(parseJsonl(await file.text(), file.name))); } catch (e) { out.append(errorBox(e)); }
  });
  main.append(h("h2", {}, "Rollout report"),
    h("p", {}, "Load a JSONL file written by ", h("code", {}, "envfoundry rollout"), ". It is read in the browser only."),
    h("label", { for: "rollout-file" }, "Rollout file "), input, out);
}

const FAILURES = ["llm_error", "service_error"];

export function rolloutReport(records) {
  const byEnv = new Map();
  for (const r of records) {
    const list = byEnv.get(r.env_id) ?? [];
    list.push(r);
    byEnv.set(r.env_id, list);
  }
  const rows = [...byEnv].map(([env, rs]) => ({ label: env,
    parts: [{ value: rs.reduce((a, r) => a + (Number(r.reward) || 0), 0) / rs.length, cls: "bar-pass", name: "mean reward" }] }));
  // As the rollout's own table does: episodes the LLM endpoint or the service ended say nothing of the agent.
  const failed = records.filter((r) => FAILURES.includes(r.finish_reason));
  return [h("p", {}, `${records.length} rollouts over ${byEnv.size} environments.`),
    failed.length ? h("p", { class: "error", role: "alert" }, `${failed.length} of ${records.length} ended because the LLM `
      + `endpoint or the service failed (${failed[0].finish_reason}: ${failed[0].error ?? ""}); their rewards are not the agent's.`) : "",
    barChart("Mean reward per environment", rows, 1, (v) => v.toFixed(2)),
    h("ol", { class: "rollouts" }, records.map((r, i) => h("li", {}, h("details", {},
      h("summary", {}, `${r.scenario_id ?? r.env_id} · sample ${r.sample ?? i} · reward ${Number(r.reward).toFixed(2)} · ${r.finish_reason ?? ""}`),
      r.error ? h("p", { class: "error" }, String(r.error)) : "",
      h("ul", { class: "checks" }, (r.checks ?? []).map((c) => h("li", { class: c.passed ? "passed" : "failed" },
        c.passed ? "✓ " : "✗ ", c.item, c.error ? ` — ${c.error}` : ""))),
      h("ol", { class: "messages" }, (r.messages ?? []).map(messageView))))))];
}

export function synthView(main) {
  const input = h("input", { type: "file", id: "synth-folder", webkitdirectory: true, multiple: true });
  const out = h("div");
  input.addEventListener("change", async () => {
    out.replaceChildren();
    try { out.append(...await synthReport([...input.files])); } catch (e) { out.append(errorBox(e)); }
  });
  main.append(h("h2", {}, "Synthesis report"),
    h("p", {}, "Pick the output folder of ", h("code", {}, "envfoundry synth"), " (its ", h("code", {}, "_work/"),
      " records are read in the browser only)."),
    h("label", { for: "synth-folder" }, "Output folder "), input, out);
}

export async function synthReport(files) {
  const find = (name) => files.find((f) => (f.webkitRelativePath || f.name).endsWith(`_work/${name}`) || f.name === name && !f.webkitRelativePath);
  const summaryFile = find("summary.json");
  const assessFile = find("assessments.jsonl");
  if (!summaryFile && !assessFile) throw new Error("no _work/summary.json or _work/assessments.jsonl in that folder");
  const out = [];
  if (summaryFile) {
    const summary = JSON.parse(await summaryFile.text());
    const stages = summary.stages ?? [];
    out.push(h("h3", {}, "Stages"), h("div", { class: "scroll" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Stage", "In", "Resumed", "Kept", "Dropped", "Failed"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, stages.map((st) => h("tr", {}, h("td", {}, st.stage), h("td", {}, String(st.items)),
        h("td", {}, String(st.resumed)), h("td", {}, String(st.kept)),
        h("td", {}, Object.entries(st.dropped ?? {}).map(([r, n]) => `${n} ${r}`).join(", ") || "0"),
        h("td", {}, String((st.failed ?? []).length))))))),
    barChart("Kept and dropped per stage", stages.map((st) => ({ label: st.stage, parts: [
      { value: st.kept, cls: "bar-pass", name: "kept" },
      { value: Object.values(st.dropped ?? {}).reduce((a, b) => a + b, 0), cls: "bar-fail", name: "dropped" },
      { value: (st.failed ?? []).length, cls: "bar-warn", name: "failed" }] })),
    Math.max(1, ...stages.map((st) => st.items))));
  }
  if (assessFile) {
    const byKey = new Map();
    for (const r of parseJsonl(await assessFile.text(), "assessments.jsonl")) if (typeof r.key === "string") byKey.set(r.key, r);
    const rows = [...byKey.values()];
    out.push(h("h3", {}, "Assessment verdicts"),
      barChart("Verdicts per environment (pass / warning / fail)", rows.map((r) => ({ label: r.key, parts: [
        { value: r.counts?.pass ?? 0, cls: "bar-pass", name: "pass" },
        { value: r.counts?.warning ?? 0, cls: "bar-warn", name: "warning" },
        { value: r.counts?.fail ?? 0, cls: "bar-fail", name: "fail" }] })),
      Math.max(1, ...rows.map((r) => r.rounds ?? 0))),
      h("ul", {}, rows.map((r) => h("li", {}, h("a", { href: `#/env/${enc(r.key)}` }, r.key), ` ${r.status}`,
        r.reason ? ` (${r.reason}${r.detail ? `: ${r.detail}` : ""})` : "", ` ratio ${r.ratio ?? "?"}`))));
  }
  return out;
}
