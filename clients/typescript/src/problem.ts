/**
 * Service errors as typed exceptions, one per problem `type` of the API (RFC 9457 problem+json).
 *
 *     ProblemError                 any problem response; `type`, `status`, `detail`, `errors`
 *     ├── UnauthorizedError        401 urn:envfoundry:problem:unauthorized (no key, or an unknown one)
 *     ├── ForbiddenError           403 urn:envfoundry:problem:forbidden (the key lacks the scope)
 *     ├── NotFoundError            404 urn:envfoundry:problem:not-found
 *     ├── InvalidRequestError      422 urn:envfoundry:problem:invalid-request (errors[].field)
 *     ├── InvalidEnvironmentError  422 urn:envfoundry:problem:invalid-environment
 *     ├── ConflictError            409 urn:envfoundry:problem:conflict
 *     ├── SessionBusyError         409 urn:envfoundry:problem:session-busy
 *     ├── PayloadTooLargeError     413 urn:envfoundry:problem:payload-too-large
 *     ├── IdempotencyKeyReusedError 422 urn:envfoundry:problem:idempotency-key-reused
 *     ├── LimitExceededError       422 urn:envfoundry:problem:limit-exceeded (body.limit names the bound)
 *     ├── QuotaExceededError       429 urn:envfoundry:problem:quota-exceeded
 *     ├── NotConversationError     409 urn:envfoundry:problem:not-conversation
 *     ├── ConversationEndedError   409 urn:envfoundry:problem:conversation-ended
 *     ├── NotTurnBasedError        409 urn:envfoundry:problem:not-turn-based
 *     ├── TurnsEndedError          409 urn:envfoundry:problem:turns-ended
 *     ├── UserLLMFailedError       502 urn:envfoundry:problem:user-llm-failed
 *     ├── UnavailableError         503 urn:envfoundry:problem:unavailable
 *     └── UserLLMUnavailableError  503 urn:envfoundry:problem:user-llm-unavailable
 *
 * Tool outcomes are not errors: a refusal answers `ok: true` with it in `result`, a call that
 * produced no answer `ok: false` with `error.type` (both HTTP 200).
 */
import type { components } from "./schema.js";

export type Problem = components["schemas"]["Problem"];
export type FieldError = { field: string; message: string };

export const PROBLEM_PREFIX = "urn:envfoundry:problem:";

export class ProblemError extends Error {
  readonly type: string;
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  readonly instance: string | undefined;
  /** The fields a 422 names, in the order the service found them. */
  readonly errors: FieldError[];
  /** The whole problem body, extension members (such as `limit` on a 413) included. */
  readonly body: Record<string, unknown>;

  constructor(status: number, body: Record<string, unknown>) {
    const detail = typeof body.detail === "string" ? body.detail : `HTTP ${status}`;
    super(detail);
    this.name = new.target.name;
    this.status = status;
    this.type = typeof body.type === "string" ? body.type : "about:blank";
    this.title = typeof body.title === "string" ? body.title : "";
    this.detail = detail;
    this.instance = typeof body.instance === "string" ? body.instance : undefined;
    this.errors = Array.isArray(body.errors) ? (body.errors as FieldError[]) : [];
    this.body = body;
  }

  /** The slug after the URN prefix, e.g. `not-found`. */
  get slug(): string {
    return this.type.startsWith(PROBLEM_PREFIX) ? this.type.slice(PROBLEM_PREFIX.length) : this.type;
  }
}

export class NotFoundError extends ProblemError {}
export class InvalidRequestError extends ProblemError {}
export class InvalidEnvironmentError extends ProblemError {}
export class ConflictError extends ProblemError {}
export class SessionBusyError extends ProblemError {}
export class PayloadTooLargeError extends ProblemError {}
export class UnauthorizedError extends ProblemError {}
export class ForbiddenError extends ProblemError {}
export class IdempotencyKeyReusedError extends ProblemError {}
export class LimitExceededError extends ProblemError {}
export class QuotaExceededError extends ProblemError {}
export class NotConversationError extends ProblemError {}
export class ConversationEndedError extends ProblemError {}
export class NotTurnBasedError extends ProblemError {}
export class TurnsEndedError extends ProblemError {}
export class UserLLMFailedError extends ProblemError {}
export class UnavailableError extends ProblemError {}
export class UserLLMUnavailableError extends ProblemError {}

const BY_SLUG: Record<string, new (status: number, body: Record<string, unknown>) => ProblemError> = {
  "not-found": NotFoundError,
  "invalid-request": InvalidRequestError,
  "invalid-environment": InvalidEnvironmentError,
  conflict: ConflictError,
  "session-busy": SessionBusyError,
  "payload-too-large": PayloadTooLargeError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  "idempotency-key-reused": IdempotencyKeyReusedError,
  "limit-exceeded": LimitExceededError,
  "quota-exceeded": QuotaExceededError,
  "not-conversation": NotConversationError,
  "conversation-ended": ConversationEndedError,
  "not-turn-based": NotTurnBasedError,
  "turns-ended": TurnsEndedError,
  "user-llm-failed": UserLLMFailedError,
  unavailable: UnavailableError,
  "user-llm-unavailable": UserLLMUnavailableError,
};

/** Problems worth retrying as they are: the same request may succeed later (the service adds Retry-After). */
export const RETRYABLE = new Set(["session-busy", "unavailable", "user-llm-failed"]);

/** The typed error for a failed response; a body that is not a problem still gives a ProblemError. */
export function problemError(status: number, body: unknown): ProblemError {
  const problem =
    body !== null && typeof body === "object" && !Array.isArray(body)
      ? (body as Record<string, unknown>)
      : { detail: typeof body === "string" && body ? body : `HTTP ${status}` };
  const type = typeof problem.type === "string" ? problem.type : "";
  const Class = type.startsWith(PROBLEM_PREFIX) ? BY_SLUG[type.slice(PROBLEM_PREFIX.length)] : undefined;
  return new (Class ?? ProblemError)(status, problem);
}
