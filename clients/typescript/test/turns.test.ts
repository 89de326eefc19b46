/** Turn-based episodes through the typed client against a real server: read the turn, end it, get the next
 * user message with the tools that arrive, score per turn, and the typed errors of the turn endpoints. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  EnvfoundryClient,
  NotTurnBasedError,
  type Reply,
  type ScenarioCreate,
  TurnsEndedError,
} from "../src/index.js";
import { startServer, type Running } from "./server.js";

const SCENARIO_ID = "ts-turns-renewal";

// Two user turns on the bundled library: renew_loan is offered only from the second.
const SCENARIO: ScenarioCreate = {
  scenario_id: SCENARIO_ID,
  env_id: "library_circulation",
  init_config: {
    members: { M002: { member_id: "M002", name: "Priya Shah", status: "active", max_loans: 3 } },
    books: { B001: { book_id: "B001", title: "Dune", total_copies: 1, available_copies: 0 } },
    loans: { L0001: { loan_id: "L0001", book_id: "B001", member_id: "M002", due_date: "2024-05-08",
                      returned: false, renewals: 0 } },
  },
  turns: [
    { message: "When is my Dune due? I am member M002.",
      checklist: [{ item: "looked up, and said so", check:
        "def check_func(s):\n    return any(c['name'] == 'list_member_loans' for c in turn_responses['calls'])" +
        " and '2024-05-08' in (turn_responses['message'] or '')\n" }] },
    { message: "Please renew it.", tools: ["renew_loan"],
      checklist: [{ item: "renewed", check: "def check_func(s):\n    return s['loans']['L0001']['renewals'] == 1\n" }] },
  ],
};

function names(tools: Record<string, unknown>[]): string[] {
  return tools.map((t) => (t.function as { name: string }).name);
}

describe("turn-based episodes through the typed client", () => {
  let server: Running;
  let client: EnvfoundryClient;
  const replies: Reply[] = [];
  before(async () => {
    server = await startServer();
    client = new EnvfoundryClient(server.url, { onReply: (reply) => replies.push(reply) });
    await client.createScenario(SCENARIO);
  });
  after(async () => {
    await client.deleteScenario(SCENARIO_ID);
    await server.stop();
  });

  test("reads the turn, ends it, gets the next message with the tool that arrives, then done", async () => {
    const created = await client.createSession({ scenario_id: SCENARIO_ID });
    const sid = created.session_id;
    try {
      const first = await client.turn(sid);
      assert.deepEqual([first.turn, first.turns, first.done, first.user_message],
                       [0, 2, false, "When is my Dune due? I am member M002."]);
      assert.ok(!names(first.tools).includes("renew_loan"));
      const early = await client.call(sid, "renew_loan", { loan_id: "L0001" });
      assert.equal(early.ok, false);
      assert.equal(early.error?.type, "unknown_tool");

      await client.call(sid, "list_member_loans", { member_id: "M002" });
      const ended = await client.endTurn(sid, "Dune is due on 2024-05-08.", { idempotencyKey: "ts-turn-0" });
      assert.deepEqual([ended.ended_turn, ended.turn, ended.turns, ended.done, ended.user_message],
                       [0, 1, 2, false, "Please renew it."]);
      assert.deepEqual(names(ended.new_tools), ["renew_loan"]);
      // A keyed retry gets the first answer and ends no second turn.
      const again = await client.endTurn(sid, "Dune is due on 2024-05-08.", { idempotencyKey: "ts-turn-0" });
      assert.deepEqual(again, ended);
      assert.equal(replies.at(-1)?.headers["idempotent-replayed"], "true");

      const second = await client.turn(sid);
      assert.equal(second.turn, 1);
      assert.ok(names(second.tools).includes("renew_loan"));
      assert.equal((await client.call(sid, "renew_loan", { loan_id: "L0001" })).ok, true);
      const last = await client.endTurn(sid);
      assert.deepEqual([last.ended_turn, last.turn, last.done, last.user_message, last.new_tools],
                       [1, null, true, null, []]);
      const over = await client.turn(sid);
      assert.deepEqual([over.turn, over.done], [null, true]);
      await assert.rejects(client.endTurn(sid), (error: unknown) =>
        error instanceof TurnsEndedError && error.status === 409 && error.slug === "turns-ended");

      const score = await client.score(sid);
      assert.equal(score.reward, 1);
      assert.equal(score.aggregation, "all_turns");
      assert.deepEqual(score.turns?.map((t) => [t.turn, t.status, t.passed]), [[0, "ended", true], [1, "ended", true]]);
    } finally {
      await client.deleteSession(sid);
    }
  });

  test("a turn's checks read the closing message it was ended with", async () => {
    const sid = (await client.createSession({ scenario_id: SCENARIO_ID })).session_id;
    try {
      await client.call(sid, "list_member_loans", { member_id: "M002" });
      await client.endTurn(sid);  // no closing message: the first turn's check fails
      const score = await client.score(sid);
      assert.equal(score.reward, 0);
      assert.deepEqual(score.turns?.map((t) => [t.status, t.passed]), [["ended", false], ["in_progress", false]]);
    } finally {
      await client.deleteSession(sid);
    }
  });

  test("a session without turns answers NotTurnBasedError on both turn endpoints", async () => {
    const sid = (await client.createSession({ scenario_id: "lib-001" })).session_id;
    try {
      for (const attempt of [() => client.turn(sid), () => client.endTurn(sid, "done")]) {
        await assert.rejects(attempt(), (error: unknown) =>
          error instanceof NotTurnBasedError && error.status === 409 && error.slug === "not-turn-based");
      }
    } finally {
      await client.deleteSession(sid);
    }
  });
});
