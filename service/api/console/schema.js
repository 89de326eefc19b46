// JSON Schema, shown and turned into forms: one field per property, required fields and types checked before sending.
import { h } from "./dom.js";

export const fn = (tool) => tool.function ?? tool;

function typeOf(schema) {
  const type = schema.type ?? (schema.enum ? "string" : "string");
  return Array.isArray(type) ? type.find((t) => t !== "null") ?? "string" : type;
}

export function schemaView(schema) {
  const props = Object.entries(schema?.properties ?? {});
  const required = new Set(schema?.required ?? []);
  if (!props.length) return h("p", { class: "muted" }, "No arguments.");
  return h("table", { class: "schema" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Argument"), h("th", { scope: "col" }, "Type"),
      h("th", { scope: "col" }, "Description"))),
    h("tbody", {}, props.map(([name, p]) => h("tr", {},
      h("td", {}, h("code", {}, name), required.has(name) ? h("span", { class: "req", title: "required" }, " *") : ""),
      h("td", {}, typeOf(p), p.enum ? ` (${p.enum.map((v) => JSON.stringify(v)).join(" | ")})` : "",
        p.items ? ` of ${typeOf(p.items)}` : ""),
      h("td", {}, p.description ?? "")))));
}

export function toolCard(tool) {
  const f = fn(tool);
  return h("article", { class: "tool" }, h("h4", {}, h("code", {}, f.name)), h("p", {}, f.description ?? ""),
    schemaView(f.parameters));
}

// Parse one field's text as its schema's type; returns [value] or throws with a message naming the field.
function parse(name, schema, text) {
  const type = typeOf(schema);
  if (type === "string") return text;
  if (type === "integer" || type === "number") {
    const n = Number(text);
    if (text.trim() === "" || Number.isNaN(n) || (type === "integer" && !Number.isInteger(n))) {
      throw new Error(`${name}: expected ${type === "integer" ? "an integer" : "a number"}`);
    }
    return n;
  }
  if (type === "boolean") return text === "true";
  let value;
  try { value = JSON.parse(text); } catch { throw new Error(`${name}: expected JSON (${type})`); }
  if (type === "array" && !Array.isArray(value)) throw new Error(`${name}: expected a JSON array`);
  if (type === "object" && (value === null || typeof value !== "object" || Array.isArray(value))) {
    throw new Error(`${name}: expected a JSON object`);
  }
  return value;
}

// A form for one tool; onSubmit(name, arguments) runs when every field is valid, and what it returns
// (a node: what the call did) is shown under the form's button.
export function toolForm(tool, onSubmit) {
  const f = fn(tool);
  const props = Object.entries(f.parameters?.properties ?? {});
  const required = new Set(f.parameters?.required ?? []);
  const base = `tool-${f.name}`;
  const error = h("p", { class: "error", role: "alert", id: `${base}-error`, hidden: true });
  const shown = h("div", { class: "call-outcome", "aria-live": "polite", "aria-label": `last call of ${f.name}` });
  const fields = props.map(([name, p]) => {
    const id = `${base}-${name}`;
    const type = typeOf(p);
    let input;
    if (p.enum) {
      input = h("select", { id, name }, h("option", { value: "" }, "—"),
        p.enum.map((v) => h("option", { value: typeof v === "string" ? v : JSON.stringify(v) }, String(v))));
    } else if (type === "boolean") {
      input = h("select", { id, name }, h("option", { value: "" }, "—"), h("option", { value: "true" }, "true"),
        h("option", { value: "false" }, "false"));
    } else if (type === "object" || type === "array") {
      input = h("textarea", { id, name, rows: 2, placeholder: type === "array" ? "[ ]" : "{ }", spellcheck: "false" });
    } else {
      input = h("input", { id, name, type: "text", inputmode: type === "string" ? "text" : "decimal",
        autocomplete: "off", spellcheck: "false" });
    }
    if (required.has(name)) input.setAttribute("aria-required", "true");
    return { name, p, input, row: h("div", { class: "field" },
      h("label", { for: id }, name, required.has(name) ? h("span", { class: "req" }, " *") : "",
        h("span", { class: "muted" }, ` ${type}`)), input,
      p.description ? h("small", {}, p.description) : "") };
  });
  const form = h("form", { class: "tool-form", "aria-labelledby": `${base}-title`, "data-tool": f.name, novalidate: true },
    h("h4", { id: `${base}-title` }, h("code", {}, f.name)),
    f.description ? h("p", { class: "muted" }, f.description) : "",
    fields.map((x) => x.row), error,
    h("button", { type: "submit" }, `Call ${f.name}`), shown);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const args = {};
    const problems = [];
    for (const { name, p, input } of fields) {
      input.removeAttribute("aria-invalid");
      const text = input.value;
      if (text === "") {
        if (required.has(name)) { problems.push(`${name}: required`); input.setAttribute("aria-invalid", "true"); }
        continue;
      }
      try { args[name] = parse(name, p, text); } catch (e) {
        problems.push(e.message); input.setAttribute("aria-invalid", "true");
      }
    }
    error.hidden = problems.length === 0;
    error.textContent = problems.join("; ");
    if (problems.length) return;
    const button = form.querySelector("button");
    button.disabled = true;
    try { shown.replaceChildren((await onSubmit(f.name, args)) ?? ""); }
    catch (e) { error.hidden = false; error.textContent = e.message; }
    finally { button.disabled = false; }
  });
  return form;
}
