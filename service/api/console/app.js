// The router: the hash names a view; every view reads the public v1 API.
import { ApiError } from "./api.js";
import { errorBox, h } from "./dom.js";
import { rolloutView, synthView } from "./reports.js";
import { sessionView } from "./session.js";
import { catalogView, environmentView, scenarioView, sessionsView } from "./views.js";

const routes = [
  [/^#\/env\/(.+)$/, environmentView],
  [/^#\/scenario\/(.+)$/, scenarioView],
  [/^#\/session\/(.+)$/, sessionView],
  [/^#\/sessions$/, sessionsView],
  [/^#\/rollout$/, rolloutView],
  [/^#\/synth$/, synthView],
  [/^(#\/?)?$/, catalogView],
];

async function render() {
  const main = document.getElementById("main");
  const hash = location.hash;
  main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  main.setAttribute("aria-busy", "true");
  const view = document.createElement("div");
  try {
    for (const [pattern, fn] of routes) {
      const match = pattern.exec(hash);
      if (match) {
        await fn(view, ...match.slice(1).map(decodeURIComponent));
        break;
      }
    }
    if (!view.childNodes.length) view.append(h("p", {}, "Nothing here. ", h("a", { href: "#/" }, "Back to the catalog")));
  } catch (e) {
    view.append(e instanceof ApiError && e.status === 404 ? h("p", { role: "alert" }, `Not found: ${e.message}`) : errorBox(e));
  }
  if (location.hash !== hash) return; // a newer navigation owns the page
  main.replaceChildren(...view.childNodes);
  main.removeAttribute("aria-busy");
  const title = main.querySelector("h2");
  document.title = `${title ? title.textContent : "envfoundry"} · envfoundry console`;
  main.focus({ preventScroll: true });
}

window.addEventListener("hashchange", render);
render();
