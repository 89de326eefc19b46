/** openapi/conformance/cases.json replayed through this client against a real server. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import { match, Mismatch, runConformance, type Case } from "../src/conformance.js";
import { ROOT, startServer, type Running } from "./server.js";

const CASES: Case[] = JSON.parse(readFileSync(`${ROOT}openapi/conformance/cases.json`, "utf8")).cases;

describe("conformance", () => {
  let server: Running;
  before(async () => {
    server = await startServer();
  });
  after(async () => server.stop());

  test("every case passes through the client", async () => {
    const outcome = await runConformance(server.url, CASES);
    console.log(outcome.lines.join("\n"));
    console.log(`conformance cases through typed methods: ${outcome.typed} of ${CASES.length}`);
    assert.equal(outcome.failed, 0, outcome.lines.filter((line) => line.startsWith("not ok")).join("\n"));
    assert.equal(outcome.passed, CASES.length);
    // Only raw bodies (3), routes the API does not have (2) and a custom header (1) bypass the typed methods.
    assert.ok(outcome.typed >= CASES.length - 6, `only ${outcome.typed} cases went through typed methods`);
  });

  test("a wrong answer fails its case and names the place", async () => {
    const outcome = await runConformance(server.url, [
      { name: "wrong status", request: { method: "GET", path: "/v1/sessions/ses_nope" }, expect: { status: 200 } },
      { name: "wrong value", request: { method: "GET", path: "/healthz" }, expect: { status: 200, body: { status: "down" } } },
      { name: "missing capture", request: { method: "GET", path: "/v1/sessions/{{nothing}}" }, expect: { status: 200 } },
    ]);
    assert.match(outcome.lines[0]!, /^not ok - wrong status: status: expected 200, got 404/);
    assert.equal(outcome.lines[1], 'not ok - wrong value: body.status: expected "down", got "ok"');
    assert.match(outcome.lines[2]!, /^not ok - missing capture: nothing captured as nothing/);
    assert.equal(outcome.lines[3], "conformance: 0 passed, 3 failed");
  });
});

test("matchers follow the rules of openapi/conformance/README.md", () => {
  const holds: [unknown, unknown, boolean][] = [
    [{ a: 1 }, { a: 1, b: 2 }, true],
    [{ a: 1 }, { b: 1 }, false],
    [[1, 2], [1, 2, 3], false],
    [{ $type: "number" }, 3, true],
    [{ $type: "integer" }, 3.5, false],
    [{ $type: "boolean" }, 0, false],
    [{ $contains: "ab" }, "xaby", true],
    [{ $contains: [{ k: 1 }] }, [{ k: 2 }, { k: 1, j: 0 }], true],
    [{ $contains: [{ k: 3 }] }, [{ k: 2 }], false],
    [{ $length: 2 }, [0, 0], true],
    [{ $present: true }, null, true],
    [{ a: { $absent: true } }, { b: 1 }, true],
    [{ a: { $absent: true } }, { a: null }, false],
    [null, false, false],
  ];
  for (const [expected, actual, ok] of holds) {
    let held = true;
    try {
      match(expected, actual);
    } catch (error) {
      assert.ok(error instanceof Mismatch);
      held = false;
    }
    assert.equal(held, ok, `${JSON.stringify(expected)} against ${JSON.stringify(actual)}`);
  }
});
