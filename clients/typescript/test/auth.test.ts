/** A service with API keys: the token option, typed 401/403, and the conformance cases under a key. */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import { type Case, runConformance } from "../src/conformance.js";
import { EnvfoundryClient, ForbiddenError, NotFoundError, UnauthorizedError } from "../src/index.js";
import { ROOT, startServer, type Running } from "./server.js";

/** A fresh key and its key-file line (`sha256:<digest> <tenant> <scopes>`). */
function newKey(tenant: string, scopes: string): [string, string] {
  const key = `efk_${randomBytes(24).toString("base64url")}`;
  return [key, `sha256:${createHash("sha256").update(key).digest("hex")} ${tenant} ${scopes}`];
}

describe("a service with API keys", () => {
  const [admin, adminLine] = newKey("tenant-a", "run,admin");
  const [runner, runnerLine] = newKey("tenant-a", "run");
  const [other, otherLine] = newKey("tenant-b", "run");
  let server: Running;
  before(async () => {
    server = await startServer({ ENVFOUNDRY_API_KEYS: [adminLine, runnerLine, otherLine].join(";") });
  });
  after(async () => server.stop());

  test("no key is a 401, a missing scope a 403, another tenant's session a 404", async () => {
    await assert.rejects(new EnvfoundryClient(server.url).listEnvironments(), UnauthorizedError);
    await assert.rejects(new EnvfoundryClient(server.url, { token: "efk_wrong" }).listEnvironments(), UnauthorizedError);
    const run = new EnvfoundryClient(server.url, { token: runner });
    const forbidden = await run
      .createEnvironment({ env_id: "nope", class_name: "X", code: "class X:\n    pass\n" } as never)
      .catch((error: unknown) => error);
    assert.ok(forbidden instanceof ForbiddenError);
    assert.equal(forbidden.status, 403);
    const { session_id } = await run.createSession({ scenario_id: "lib-001" });
    await assert.rejects(new EnvfoundryClient(server.url, { token: other }).state(session_id), NotFoundError);
  });

  test("the conformance cases pass with an admin key", async () => {
    const cases: Case[] = JSON.parse(readFileSync(`${ROOT}openapi/conformance/cases.json`, "utf8")).cases;
    const outcome = await runConformance(server.url, cases, { authorization: `Bearer ${admin}` });
    assert.equal(outcome.failed, 0, outcome.lines.filter((line) => line.startsWith("not ok")).join("\n"));
  });
});
