// Python source as highlighted nodes: every token goes in through textContent (the source is untrusted).
import { h } from "./dom.js";

const KEYWORDS = new Set(("False None True and as assert async await break class continue def del elif else except " +
  "finally for from global if import in is lambda nonlocal not or pass raise return try while with yield").split(" "));
// Triple-quoted strings first, then one-line strings, comments, decorators, numbers and names.
const TOKEN = /("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|#[^\n]*|@[A-Za-z_][\w.]*|\b\d[\d_.eExXa-fA-F]*\b|\b[A-Za-z_]\w*\b)/g;

export function highlight(source) {
  const out = [];
  let last = 0;
  for (const match of source.matchAll(TOKEN)) {
    const text = match[0];
    if (match.index > last) out.push(source.slice(last, match.index));
    out.push(token(text));
    last = match.index + text.length;
  }
  if (last < source.length) out.push(source.slice(last));
  return out;
}

function token(text) {
  const first = text[0];
  if (first === "#") return h("span", { class: "tok-com" }, text);
  if (first === '"' || first === "'") return h("span", { class: "tok-str" }, text);
  if (first === "@") return h("span", { class: "tok-dec" }, text);
  if (/\d/.test(first)) return h("span", { class: "tok-num" }, text);
  if (KEYWORDS.has(text)) return h("span", { class: "tok-kw" }, text);
  return text;
}
