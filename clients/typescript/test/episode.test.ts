/** A whole episode through the typed client against a real server, and its typed errors. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import {
  EnvfoundryClient,
  IdempotencyKeyReusedError,
  InvalidRequestError,
  NotConversationError,
  NotFoundError,
  ProblemError,
  type Reply,
} from "../src/index.js";
import { ROOT, startServer, type Running } from "./server.js";

interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

const WALLET_CODE = `class Wallet:
    def __init__(self):
        self.balance = 0

    def deposit(self, amount: int) -> dict:
        """Add money."""
        self.balance += amount
        return {"success": True, "data": self.balance}
`;

function referenceSolution(scenarioId: string): ToolCall[] {
  const lines = readFileSync(`${ROOT}catalog/library_circulation/scenarios.jsonl`, "utf8").split("\n").filter(Boolean);
  const scenario = lines.map((line) => JSON.parse(line)).find((s) => s.scenario_id === scenarioId);
  return scenario.reference_solution as ToolCall[];
}

describe("the typed client against a live server", () => {
  let server: Running;
  let client: EnvfoundryClient;
  before(async () => {
    server = await startServer();
    client = new EnvfoundryClient(server.url);
  });
  after(async () => server.stop());

  test("adds a new version under an id and reaches the first by its label", async () => {
    const first = await client.createEnvironment({ env_id: "ts-versions", class_name: "Wallet", code: WALLET_CODE,
                                                   label: "first" });
    try {
      const second = await client.createEnvironment({ env_id: "ts-versions", class_name: "Wallet",
                                                      code: WALLET_CODE.replace("Add money.", "Add money now.") });
      assert.notEqual(second.version, first.version);
      const listed = await client.environmentVersions("ts-versions");
      assert.deepEqual(listed.versions.map((v) => [v.version, v.latest]), [[first.version, false], [second.version, true]]);
      assert.deepEqual(listed.versions[1]!.changes, { added: [], removed: [], changed: ["deposit"] });
      assert.equal((await client.getEnvironment("ts-versions@first")).version, first.version);
      const manifest = await client.catalogManifest();
      assert.equal(manifest.environments["library_circulation"],
                   (await client.getEnvironment("library_circulation")).version);
    } finally {
      await client.deleteEnvironment("ts-versions");
    }
  });

  test("pages through scenarios by cursor and filters them by split and tag", async () => {
    const first = await client.findScenarios({ limit: 2 });
    assert.equal(first.scenarios.length, 2);
    assert.ok(first.next_cursor && first.next?.includes("cursor="));
    const all = [];
    for await (const s of client.iterScenarios({ limit: 3 })) all.push(s.scenario_id);
    assert.equal(all.length, first.total);
    assert.deepEqual(all, [...new Set(all)].sort());
    const env = await client.listScenarios("library_circulation", { limit: 2 });
    assert.ok(env.scenarios.every((s) => s.env_id === "library_circulation") && env.total >= 4);
    await client.createEnvironment({ env_id: "ts-labels", class_name: "Wallet", code: WALLET_CODE });
    try {
      for (const [id, split] of [["ts-l-1", "test"], ["ts-l-2", "train"], ["ts-l-3", "test"]] as const) {
        await client.createScenario({ scenario_id: id, env_id: "ts-labels", task: "t", split, tags: ["ts", split] });
      }
      const test_ = await client.findScenarios({ env: "ts-labels", split: "test", tag: ["ts", "test"] });
      assert.deepEqual(test_.scenarios.map((s) => s.scenario_id), ["ts-l-1", "ts-l-3"]);
      assert.deepEqual(test_.scenarios[0]!.tags, ["ts", "test"]);
      await assert.rejects(client.findScenarios({ limit: 1001 }),
                           (e: unknown) => e instanceof InvalidRequestError && e.detail.includes("limit"));
    } finally {
      for (const id of ["ts-l-1", "ts-l-2", "ts-l-3"]) await client.deleteScenario(id);
      await client.deleteEnvironment("ts-labels");
    }
  });

  test("plays a whole episode: create, call, observe, fork, score, delete", async () => {
    const solution = referenceSolution("lib-001");
    const session = await client.createSession({ scenario_id: "lib-001" });
    assert.equal(session.scenario_id, "lib-001");
    assert.match(session.task ?? "", /Priya/);
    assert.equal((await client.tools(session.session_id)).tools.length, session.tools.length);

    for (const [index, call] of solution.entries()) {
      const result = await client.call(session.session_id, call.name, call.arguments);
      assert.equal(result.ok, true, result.observation);
      assert.equal(result.step, index + 1);
    }
    const state = await client.state(session.session_id);
    assert.equal(state.step, solution.length);
    const trajectory = await client.trajectory(session.session_id);
    assert.deepEqual(trajectory.steps.map((s) => ("name" in s ? s.name : "message")), solution.map((c) => c.name));
    assert.equal(trajectory.total, solution.length);
    const second = await client.trajectory(session.session_id, { offset: 1, limit: 1 });
    assert.deepEqual([second.steps.length, second.steps[0]?.step, second.total, second.offset], [1, 2, 3, 1]);
    const score = await client.score(session.session_id);
    assert.deepEqual([score.reward, score.passed, score.total], [1, 3, 3]);

    const fork = await client.fork(session.session_id);
    assert.equal((await client.getSession(fork.session_id)).parent_id, session.session_id);
    await client.call(fork.session_id, "return_book", { loan_id: "L0001" });
    assert.equal((await client.getSession(session.session_id)).steps, solution.length);
    assert.equal((await client.score(fork.session_id)).passed, 2);

    await client.deleteSession(fork.session_id);
    await assert.rejects(client.getSession(fork.session_id), NotFoundError);

    // back to any step: a past state, and a fork there with the first steps of the trajectory
    const afterFirst = await client.state(session.session_id, 1);
    assert.equal(afterFirst.step, 1);
    const rewound = await client.fork(session.session_id, { step: 1 });
    assert.deepEqual(await client.state(rewound.session_id), afterFirst);
    assert.equal((await client.trajectory(rewound.session_id)).total, 1);
    assert.equal((await client.getSession(session.session_id)).steps, solution.length);
    await client.deleteSession(rewound.session_id);
    await client.deleteSession(session.session_id);
  });

  test("groups, forks of a group and idempotent retries", async () => {
    const replies: Reply[] = [];
    const watched = new EnvfoundryClient(server.url, { onReply: (reply) => replies.push(reply) });
    const group = await watched.createSession({ scenario_id: "lib-001", n: 3 });
    assert.equal(group.session_ids.length, 3);
    assert.equal(group.session_ids[0], group.session_id);
    const forks = await watched.fork(group.session_ids[2]!, { n: 2 });
    assert.equal(forks.session_ids.length, 2);

    const key = `retry-${Date.now()}`;
    const first = await watched.call(group.session_id, "return_book", { loan_id: "L0003" }, { idempotencyKey: key });
    const again = await watched.call(group.session_id, "return_book", { loan_id: "L0003" }, { idempotencyKey: key });
    assert.deepEqual(again, first);
    assert.equal(replies.at(-1)?.headers["idempotent-replayed"], "true");
    await assert.rejects(watched.call(group.session_id, "renew_loan", { loan_id: "L0001" }, { idempotencyKey: key }),
                         IdempotencyKeyReusedError);
    assert.equal((await watched.getSession(group.session_id)).steps, 1);
    await assert.rejects(watched.message(group.session_id, "hello"), NotConversationError);
  });

  test("a tool failure is an answer with error.type, not an exception, and changes nothing", async () => {
    const { session_id } = await client.createSession({ scenario_id: "lib-001" });
    const before = await client.state(session_id);
    const unknown = await client.call(session_id, "fly_to_the_moon");
    assert.equal(unknown.ok, false);
    assert.equal(unknown.error?.type, "unknown_tool");
    const invalid = await client.call(session_id, "return_book", '{"loan_id": 42}');
    assert.equal(invalid.error?.type, "invalid_arguments");
    assert.deepEqual((await client.state(session_id)).state, before.state);
  });

  test("service errors are typed: the problem type, the status and the field named", async () => {
    const missing = await client.getSession("ses_does_not_exist").catch((error: unknown) => error);
    assert.ok(missing instanceof NotFoundError);
    assert.equal(missing.status, 404);
    assert.equal(missing.type, "urn:envfoundry:problem:not-found");
    assert.equal(missing.slug, "not-found");
    assert.match(missing.detail, /ses_does_not_exist/);

    const invalid = await client
      .createSession({ scenario_id: "lib-001", bogus: 1 } as never)
      .catch((error: unknown) => error);
    assert.ok(invalid instanceof InvalidRequestError);
    assert.ok(invalid instanceof ProblemError);
    assert.equal(invalid.status, 422);
    assert.deepEqual(invalid.errors.map((e) => e.field), ["bogus"]);
  });
});
