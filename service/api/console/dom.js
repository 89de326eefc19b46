// Building DOM nodes: text always goes through textContent, so untrusted data is never parsed as HTML.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  append(node, children);
  return node;
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

// A collapsible tree of a JSON value. Objects of the form {"$ref": "/a/b"} are links to the node at that path.
export function tree(value, path = "", idPrefix = "node", key = null) {
  const id = `${idPrefix}${path.replaceAll(/[^A-Za-z0-9_-]/g, (c) => `_${c.charCodeAt(0)}`)}`;
  if (value && typeof value === "object" && !Array.isArray(value) && typeof value.$ref === "string"
      && Object.keys(value).length === 1) {
    const target = `${idPrefix}${value.$ref.replaceAll(/[^A-Za-z0-9_-]/g, (c) => `_${c.charCodeAt(0)}`)}`;
    return h("a", { class: "ref", href: `#${target}`, onclick: (e) => {
      e.preventDefault();
      const node = document.getElementById(target);
      if (!node) return;
      for (let d = node.parentElement; d; d = d.parentElement) if (d.tagName === "DETAILS") d.open = true;
      node.scrollIntoView({ block: "center" });
      node.classList.add("flash");
      node.focus();
      setTimeout(() => node.classList.remove("flash"), 1200);
    } }, `→ ${value.$ref}`);
  }
  if (value === null || typeof value !== "object") {
    return h("span", { class: `leaf ${value === null ? "null" : typeof value}`, id, tabindex: -1 }, JSON.stringify(value));
  }
  const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
  const label = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
  const child = ([k, v]) => {
    const sub = `${path}/${k.replaceAll("~", "~0").replaceAll("/", "~1")}`;
    const node = tree(v, sub, idPrefix, k);
    return h("li", {}, node.tagName === "DETAILS" ? node : [h("span", { class: "key" }, k), ": ", node]);
  };
  return h("details", { open: path.split("/").length < 3, id, tabindex: -1 },
    h("summary", {}, key === null ? "" : [h("span", { class: "key" }, key), ": "], label),
    h("ul", { class: "tree" }, entries.map(child)));
}

export function status(text) {
  document.getElementById("status").textContent = text;
}

export function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, err instanceof Error ? err.message : String(err));
}
