import assert from "node:assert/strict";
import { test } from "node:test";

import { NotFoundError, PayloadTooLargeError, ProblemError, problemError, SessionBusyError } from "../src/problem.js";

test("each problem type becomes its own error class with the body's fields", () => {
  const tooLarge = problemError(413, { type: "urn:envfoundry:problem:payload-too-large", title: "Payload too large",
                                       status: 413, detail: "over", limit: 10 });
  assert.ok(tooLarge instanceof PayloadTooLargeError);
  assert.equal(tooLarge.body.limit, 10);
  assert.ok(problemError(404, { type: "urn:envfoundry:problem:not-found" }) instanceof NotFoundError);
  assert.ok(problemError(409, { type: "urn:envfoundry:problem:session-busy" }) instanceof SessionBusyError);
});

test("an answer that is not a problem still throws a ProblemError with the status", () => {
  const error = problemError(502, "Bad Gateway");
  assert.equal(error.constructor, ProblemError);
  assert.equal(error.status, 502);
  assert.equal(error.detail, "Bad Gateway");
});
