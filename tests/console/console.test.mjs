// Drives the web console in the system chromium against servers started by tests/test_console.py.
// Input comes from environment variables (set by that test); prints one line per behaviour checked.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (run through tests/test_console.py)`);
  return value;
};
const URL_OPEN = env("CONSOLE_URL");
const URL_KEYED = env("CONSOLE_KEYED_URL");
const KEY = env("CONSOLE_KEY");
const SHOTS = env("CONSOLE_SHOTS");
const SCENARIO = JSON.parse(env("CONSOLE_SCENARIO"));
const ROLLOUT = env("CONSOLE_ROLLOUT");
const ROLLOUT_FAILED = env("CONSOLE_ROLLOUT_FAILED");
const SYNTH = env("CONSOLE_SYNTH");
const HOSTILE = env("CONSOLE_HOSTILE_SCENARIO");
const USER_LINES = JSON.parse(env("CONSOLE_USER_LINES"));
const HOSTILE_TEXT = env("CONSOLE_HOSTILE_TEXT");

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: ["--no-sandbox"] });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const page = await context.newPage();
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.on("console", (m) => { if (m.type() === "error" && !/401|Unauthorized/.test(m.text())) problems.push(`console: ${m.text()} ${m.location().url}`); });
page.setDefaultTimeout(15000);
const shot = async (name, p = page) => {
  const path = join(SHOTS, `${name}.png`);
  await p.screenshot({ path, fullPage: true });
  console.log(`screenshot ${path}`);
};
const ok = (text) => console.log(`ok - ${text}`);

try {
  // Catalog: /ui redirects to /ui/ and lists the bundled environments.
  await page.goto(`${URL_OPEN}/ui`);
  assert.ok(page.url().endsWith("/ui/"), `redirected to ${page.url()}`);
  await page.getByRole("link", { name: SCENARIO.env_id, exact: true }).click();
  await page.getByRole("heading", { name: "Rules" }).waitFor();
  assert.ok(await page.locator("section:has(#rules-h) li").count() > 1, "one list item per rule");
  const toolsHeading = await page.getByRole("heading", { name: /^Tools \(\d+\)$/ }).textContent();
  assert.ok(Number(toolsHeading.match(/\d+/)[0]) > 0);
  assert.ok(await page.locator("table.schema").count() > 0, "tool schemas rendered as tables");
  await page.locator("details.source summary").click();
  const source = page.locator("details.source code.python");
  const sourceText = await source.textContent();
  assert.ok(/class \w+/.test(sourceText) && sourceText.includes("def "), "the class source is shown");
  assert.ok(await source.locator("span.tok-kw").count() > 10, "Python keywords are highlighted");
  assert.ok(await source.locator("span.tok-str").count() > 0, "strings are highlighted");
  await page.getByRole("heading", { name: /^Versions \(\d+\)$/ }).waitFor();
  const chosen = await page.locator("select#version option[selected]").textContent();
  assert.ok(/^[0-9a-f]{12}/.test(chosen) && chosen.includes("(latest)"), `the served version is selected: ${chosen}`);
  assert.ok((await page.locator("section:has(#versions-h) ol.versions li").first().textContent()).includes("added"),
    "each version says what it changed in the tools");
  await shot("01-environment");
  ok("the catalog lists environments; an environment shows rules, tools with their JSON Schemas, scenarios and its highlighted class source");

  await page.getByRole("link", { name: SCENARIO.scenario_id, exact: true }).click();
  await page.getByRole("heading", { name: "Checklist" }).waitFor();
  assert.equal(await page.locator("section:has(#check-h) li").count(), SCENARIO.checklist.length);
  assert.ok(await page.locator("section:has(#init-h) details").count() > 0, "initial state is a tree");
  await shot("02-scenario");
  ok("a scenario shows its task, initial state tree and checklist");

  await page.getByRole("button", { name: "Create session" }).click();
  await page.waitForURL(/#\/session\//);
  const sessionId = decodeURIComponent(page.url().split("#/session/")[1]);
  await page.getByText(`Reward 0.00 (0/${SCENARIO.checklist.length})`).waitFor();
  ok(`creating a session opens it with score 0 (${sessionId})`);

  // Client-side validation: an empty required field is refused before any call is sent.
  const first = SCENARIO.reference_solution[0];
  const firstForm = page.locator(`form[data-tool="${first.name}"]`);
  await firstForm.getByRole("button").click();
  await firstForm.getByRole("alert").filter({ hasText: "required" }).waitFor();
  assert.equal(await page.locator(".timeline > li").count(), 0);
  ok("a missing required argument is shown on the form and nothing is called");

  // The tabs for state and trajectory are in the first screen, not below every tool form.
  const tabTops = [];
  for (const name of [/^Tools \(\d+\)$/, /^State$/, /^Trajectory/]) {
    // Measured from the top of the page, not of the viewport: where it is without any scrolling.
    const bottom = await page.getByRole("tab", { name }).evaluate((el) => el.getBoundingClientRect().bottom + window.scrollY);
    assert.ok(bottom <= 900, `the ${name} tab ends ${bottom}px down the page, below a 900px window`);
    tabTops.push(Math.round(bottom));
  }
  ok(`the tools, state and trajectory tabs are all within the first screen (bottom edges at ${tabTops.join(", ")} px)`);

  const fill = async (form, args) => {
    for (const [name, value] of Object.entries(args)) {
      await form.getByLabel(new RegExp(`^${name}\\b`)).fill(typeof value === "string" ? value : JSON.stringify(value));
    }
  };
  for (const [i, step] of SCENARIO.reference_solution.entries()) {
    const form = page.locator(`form[data-tool="${step.name}"]`);
    await fill(form, step.arguments);
    await form.getByRole("button", { name: `Call ${step.name}` }).click();
    // What the call did appears under the form that made it: outcome, result and state diff.
    const done = form.locator(".call-outcome .last-call.ok");
    await done.getByText(`Step #${i + 1}: ✓ ok`).waitFor();
    assert.ok(await done.locator("pre.json").isVisible(), `step ${i + 1} shows its result beside the form`);
    assert.ok(await done.locator(".diff li").count() > 0, `step ${i + 1} shows its state diff beside the form`);
    ok(`called ${step.name} through its form; the form shows step ${i + 1}'s result and diff`);
  }
  const total = SCENARIO.checklist.length;
  await page.getByText(`Reward 1.00 (${total}/${total})`).waitFor();
  assert.equal(await page.locator(".score .checks li.passed").count(), total);
  await shot("03-session-solved");
  ok("after the reference solution the score panel shows reward 1.00 with every check passed");

  await page.getByRole("tab", { name: `Trajectory (${SCENARIO.reference_solution.length})` }).click();
  const steps = page.locator(".timeline > li");
  assert.equal(await steps.count(), SCENARIO.reference_solution.length);
  for (const [i, step] of SCENARIO.reference_solution.entries()) {
    assert.ok((await steps.nth(i).textContent()).includes(step.name));
    assert.ok(await steps.nth(i).locator(".diff li").first().isVisible(), `step ${i + 1} has a diff in the timeline`);
  }
  await page.getByRole("tab", { name: "State" }).click();
  await page.locator(".state details").first().waitFor();
  await page.getByRole("tab", { name: /^Tools/ }).click();
  ok("the trajectory tab lists every step with its diff, and the state tab shows the state");

  await page.getByRole("button", { name: "Fork", exact: true }).click();
  await page.waitForURL((u) => !u.hash.endsWith(encodeURIComponent(sessionId)) && u.hash.startsWith("#/session/"));
  const forkId = decodeURIComponent(page.url().split("#/session/")[1]);
  await page.getByText(`Reward 1.00 (${total}/${total})`).waitFor();
  await page.getByText(`forked from`).waitFor();
  assert.equal(await page.locator(".timeline > li").count(), SCENARIO.reference_solution.length);
  await shot("04-fork");
  ok(`fork opens the copy (${forkId}) with the same trajectory and score`);

  // Back to a past step: "Fork here" on the first step opens a session at the state after it.
  await page.getByRole("tab", { name: /^Trajectory/ }).click();
  await page.locator(".timeline > li").first().getByRole("button", { name: "Fork here" }).click();
  await page.waitForURL((u) => !u.hash.endsWith(encodeURIComponent(forkId)) && u.hash.startsWith("#/session/"));
  await page.getByRole("tab", { name: "Trajectory (1)" }).waitFor();
  const rewoundId = decodeURIComponent(page.url().split("#/session/")[1]);
  const rewound = await (await fetch(`${URL_OPEN}/v1/sessions/${encodeURIComponent(rewoundId)}`)).json();
  assert.equal(rewound.steps, 1, "the session made at step 1 holds one step");
  await shot("04b-fork-here");
  ok("Fork here on step 1 opens a session at that step, with its one step");
  await page.goBack();
  await page.getByText(`forked from`).waitFor();
  await page.getByRole("tab", { name: /^Tools/ }).click();

  // A tool that says no answered the call: the console shows a refusal, not a success and not a failure.
  const renew = page.locator('form[data-tool="renew_loan"]');
  await fill(renew, { loan_id: "L9999" });
  await renew.getByRole("button").click();
  const refusal = renew.locator(".call-outcome .last-call.refused");
  await refusal.getByText("⊘ refused").waitFor();
  assert.ok((await refusal.textContent()).includes("Loan 'L9999' not found"));
  await page.getByRole("tab", { name: /^Trajectory/ }).click();
  const refusedStep = page.locator(".timeline > li").last();
  assert.ok(await refusedStep.evaluate((li) => li.classList.contains("refused")), "the refused step is marked refused");
  const heading = await refusedStep.locator("h4").textContent();
  assert.ok(heading.includes("⊘ refused") && !heading.includes("✓"), heading);
  await shot("04b-refusal");
  ok("a refused call is marked as a refusal beside its form and in the trajectory, never with a ✓");

  await page.getByRole("link", { name: "Live sessions" }).click();
  await page.getByRole("link", { name: forkId }).waitFor();
  await page.getByRole("link", { name: sessionId }).waitFor();
  await shot("05-live-sessions");
  ok("the live-sessions table lists both sessions");

  await page.getByRole("link", { name: forkId }).click();
  await page.getByRole("button", { name: "Delete" }).waitFor();
  page.once("dialog", (d) => d.dismiss());
  await page.getByRole("button", { name: "Delete" }).click();
  await page.getByText(`Reward 1.00 (${total}/${total})`).waitFor();
  assert.ok(page.url().endsWith(encodeURIComponent(forkId)), "a dismissed confirmation keeps the session page");
  let asked = "";
  page.once("dialog", (d) => { asked = d.message(); d.accept(); });
  await page.getByRole("button", { name: "Delete" }).click();
  await page.waitForURL(/#\/sessions$/);
  assert.ok(asked.startsWith(`Delete session ${forkId}?`), asked);
  await page.getByRole("link", { name: sessionId }).waitFor();
  assert.equal(await page.getByRole("link", { name: forkId }).count(), 0);
  ok("delete asks first; dismissed it keeps the session, accepted it removes it and returns to the live-sessions table");

  // Narrow window: the session view reflows without horizontal scrolling.
  await page.setViewportSize({ width: 360, height: 800 });
  await page.getByRole("link", { name: sessionId }).click();
  await page.getByText(`Reward 1.00`).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 1, `page is ${overflow}px wider than a 360px window`);
  await shot("06-session-narrow");
  ok("the session view fits a 360px-wide window");
  await page.setViewportSize({ width: 1280, height: 900 });

  await page.getByRole("link", { name: "Rollout report" }).click();
  await page.getByLabel("Rollout file").setInputFiles(ROLLOUT);
  await page.getByRole("img", { name: "Mean reward per environment" }).waitFor();
  assert.ok((await page.locator("svg.chart").textContent()).includes(SCENARIO.env_id));
  assert.ok(await page.locator(".rollouts > li").count() > 0);
  await page.locator(".rollouts summary").first().click();
  await page.locator(".rollouts .msg.tool").first().waitFor();
  assert.equal(await page.getByRole("alert").count(), 0, "a rollout without failures raises no alarm");
  await shot("07-rollout");
  ok("a rollout JSONL shows mean reward per environment as a chart and each trajectory's messages");
  await page.getByLabel("Rollout file").setInputFiles(ROLLOUT_FAILED);
  await page.getByRole("alert").filter({ hasText: "1 of 1 ended because the LLM endpoint or the service failed (llm_error: no answer" }).waitFor();
  ok("a rollout whose episodes the LLM endpoint ended says so above the chart");

  await page.getByRole("link", { name: "Synthesis report" }).click();
  await page.getByLabel("Output folder").setInputFiles(SYNTH);
  await page.getByRole("img", { name: "Kept and dropped per stage" }).waitFor();
  await page.getByRole("img", { name: /Verdicts per environment/ }).waitFor();
  await shot("08-synthesis");
  ok("a synth output folder shows per-stage counts and assessment verdicts per environment as charts");

  // Shared references in the state are links that jump to the referenced node.
  await page.goto(`${URL_OPEN}/ui/#/scenario/fs-001`);
  await page.getByRole("button", { name: "Create session" }).click();
  await page.waitForURL(/#\/session\//);
  await page.getByRole("tab", { name: "State" }).click();
  const ref = page.locator(".state a.ref:visible", { hasText: "→ /root" }).first();
  await ref.click();
  assert.equal(await page.evaluate(() => document.activeElement?.id), "state_47root");
  ok("a {\"$ref\": \"/root\"} in the state is a link that moves focus to the /root node");

  // What synthesis recorded about an environment is shown on its page.
  await page.goto(`${URL_OPEN}/ui/#/env/file_system`);
  await page.getByRole("heading", { name: "Assessment (from synthesis)" }).waitFor();
  const provenance = await page.locator("section:has(#prov-h) table").textContent();
  assert.ok(provenance.includes("chmod") && provenance.includes("make_dir") && provenance.includes("fail 3"), provenance);
  ok("an environment's assessment provenance (verdicts before and after repair, repaired and removed tools) is shown");

  // Conversation mode: the simulated user's opening line, then each exchange, in the panel and the timeline.
  await page.goto(`${URL_OPEN}/ui/#/scenario/${SCENARIO.scenario_id}`);
  await page.getByLabel("Mode").selectOption("conversation");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.waitForURL(/#\/session\//);
  const chat = page.getByRole("list", { name: "conversation" });
  await chat.getByText(USER_LINES[0]).waitFor();
  assert.equal(await page.getByText(SCENARIO.task).count(), 0, "the hidden goal is not shown");
  await page.getByLabel("Message to the user").fill("Which loan would you like to return?");
  await page.getByRole("button", { name: "Send" }).click();
  await chat.getByText(USER_LINES[1]).waitFor();
  await page.getByRole("tab", { name: /^Trajectory/ }).click();
  await page.locator(".timeline > li.message").first().waitFor();
  await shot("10-conversation");
  ok("a conversation session shows the simulated user's opening line and each reply");

  // Arguments are typed by the tool's JSON Schema: an integer field refuses text and fractions, and sends a number.
  await page.goto(`${URL_OPEN}/ui/#/env/bank_ledger`);
  await page.locator("section:has(#scen-h) h4 a").first().click();
  await page.getByRole("button", { name: "Create session" }).click();
  await page.waitForURL(/#\/session\//);
  const listing = page.locator('form[data-tool="list_transactions"]');
  await listing.getByLabel(/^account_id\b/).fill("A-none");
  for (const bad of ["abc", "2.5"]) {
    await listing.getByLabel(/^limit\b/).fill(bad);
    await listing.getByRole("button").click();
    await listing.getByRole("alert").filter({ hasText: "limit: expected an integer" }).waitFor();
    assert.equal(await listing.getByLabel(/^limit\b/).getAttribute("aria-invalid"), "true");
  }
  assert.equal(await page.locator(".timeline > li").count(), 0);
  await listing.getByLabel(/^limit\b/).fill("3");
  await listing.getByRole("button").click();
  await listing.locator(".call-outcome .last-call").waitFor();
  await page.getByRole("tab", { name: /^Trajectory/ }).click();
  await page.locator(".timeline > li").first().waitFor();
  await page.locator(".timeline > li details").first().click();
  assert.ok((await page.locator(".timeline > li pre").first().textContent()).includes('"limit": 3'));
  ok("an integer argument refuses 'abc' and '2.5' on the form and is sent as a JSON number");

  // Environment data is untrusted: markup in a scenario is shown as text, never parsed.
  await page.goto(`${URL_OPEN}/ui/#/scenario/${HOSTILE}`);
  await page.getByRole("heading", { name: "Checklist" }).waitFor();
  await page.getByText(HOSTILE_TEXT).first().waitFor();
  assert.equal(await page.locator("main img, main script").count(), 0);
  assert.equal(await page.evaluate(() => window.__pwned ?? null), null);
  ok("markup in a scenario's task, checklist and state is shown as text");

  // Keyed server: the console asks for a key, a wrong one asks again, the right one opens the catalog.
  const keyed = await browser.newPage();
  keyed.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await keyed.goto(`${URL_KEYED}/ui/`);
  const dialog = keyed.getByRole("dialog", { name: "API key" });
  await dialog.waitFor();
  await shot("09-key-prompt", keyed);
  await dialog.getByLabel("Key").fill("efk_wrong");
  await dialog.getByRole("button", { name: "Use key" }).click();
  await dialog.waitFor();
  await dialog.getByLabel("Key").fill(KEY);
  await dialog.getByRole("button", { name: "Use key" }).click();
  await keyed.getByRole("link", { name: SCENARIO.env_id, exact: true }).waitFor();
  assert.equal(await keyed.evaluate(() => sessionStorage.getItem("envfoundry.key")), KEY);
  ok("a keyed server prompts for a key, prompts again after a 401, and works with the right key");

  assert.deepEqual(problems, []);
  ok("no script errors in the page");
} catch (error) {
  await shot("failure").catch(() => {});
  console.error(problems.join("\n"));
  throw error;
} finally {
  await browser.close();
}
