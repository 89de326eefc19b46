/**
 * Replays openapi/conformance/cases.json through this client (rules: openapi/conformance/README.md).
 *
 * A case whose request maps onto a typed method goes through that method, so the client's paths,
 * bodies and typed errors are what is checked; the exchange itself is observed with `onReply`.
 * Requests no method can make (raw or oversized bodies, unknown routes) go through `send`, or
 * node:http for `body_size` (fetch cannot wait for `100 Continue`).
 */
import { request as httpRequest } from "node:http";
import { randomUUID } from "node:crypto";
import { request as httpsRequest } from "node:https";

import { EnvfoundryClient, type Once, type Reply, type ScenarioFilter } from "./client.js";
import { ProblemError } from "./problem.js";

export interface Case {
  name: string;
  request: {
    method: string;
    path: string;
    json?: unknown;
    body?: string;
    body_repeat?: { prefix: string; item: string; separator: string; count: number; suffix: string };
    body_size?: number;
    headers?: Record<string, string>;
  };
  expect: { status: number; content_type?: string; headers?: Record<string, unknown>; body?: unknown };
  capture?: Record<string, string>;
}

export interface Outcome {
  passed: number;
  failed: number;
  /** Cases that went through a typed method rather than `send`. */
  typed: number;
  lines: string[];
}

export class Mismatch extends Error {}

type Json = Record<string, unknown>;
type Route = [string, RegExp,
  (client: EnvfoundryClient, ids: string[], json: unknown, once: Once | undefined, query: URLSearchParams) => Promise<unknown>];

function page(query: URLSearchParams): { offset?: number; limit?: number } {
  const offset = query.get("offset");
  const limit = query.get("limit");
  return { ...(offset === null ? {} : { offset: Number(offset) }), ...(limit === null ? {} : { limit: Number(limit) }) };
}
const ID = "([^/]+)";
const ROUTES: Route[] = [
  ["GET", /^\/healthz$/, (c) => c.health()],
  ["GET", /^\/readyz$/, (c) => c.ready()],
  ["GET", /^\/v1\/environments$/, (c) => c.listEnvironments()],
  ["POST", /^\/v1\/environments$/, (c, _, j) => c.createEnvironment(j as never)],
  ["GET", new RegExp(`^/v1/environments/${ID}$`), (c, [id]) => c.getEnvironment(id!)],
  ["DELETE", new RegExp(`^/v1/environments/${ID}$`), (c, [id]) => c.deleteEnvironment(id!)],
  ["GET", new RegExp(`^/v1/environments/${ID}/scenarios$`), (c, [id], _, __, q) => c.listScenarios(id!, filter(q))],
  ["GET", /^\/v1\/scenarios$/, (c, _, __, ___, q) => c.findScenarios(filter(q))],
  ["GET", new RegExp(`^/v1/scenarios/${ID}$`), (c, [id]) => c.getScenario(id!)],
  ["DELETE", new RegExp(`^/v1/scenarios/${ID}$`), (c, [id]) => c.deleteScenario(id!)],
  ["POST", /^\/v1\/scenarios$/, (c, _, j) => c.createScenario(j as never)],
  ["POST", /^\/v1\/sessions$/, (c, _, j, o) => c.createSession(j as never, o)],
  ["GET", /^\/v1\/sessions$/, (c, _, __, ___, q) => c.listSessions(page(q))],
  ["GET", new RegExp(`^/v1/sessions/${ID}$`), (c, [id]) => c.getSession(id!)],
  ["DELETE", new RegExp(`^/v1/sessions/${ID}$`), (c, [id]) => c.deleteSession(id!)],
  ["GET", new RegExp(`^/v1/sessions/${ID}/tools$`), (c, [id]) => c.tools(id!)],
  ["POST", new RegExp(`^/v1/sessions/${ID}/calls$`), (c, [id], j, o) => c.callWith(id!, j as never, o)],
  ["POST", new RegExp(`^/v1/sessions/${ID}/messages$`), (c, [id], j, o) => c.messageWith(id!, j as never, o)],
  ["GET", new RegExp(`^/v1/sessions/${ID}/state$`), (c, [id]) => c.state(id!)],
  ["GET", new RegExp(`^/v1/sessions/${ID}/trajectory$`), (c, [id], _, __, q) => c.trajectory(id!, page(q))],
  ["POST", new RegExp(`^/v1/sessions/${ID}/score$`), (c, [id]) => c.score(id!)],
  ["POST", new RegExp(`^/v1/sessions/${ID}/fork$`), (c, [id], j, o) => c.fork(id!, j as never, o)],
];

function filter(query: URLSearchParams): ScenarioFilter {
  const limit = query.get("limit");
  const pick = (name: string) => query.get(name) ?? undefined;
  return { env: pick("env"), split: pick("split"), tag: query.getAll("tag"), cursor: pick("cursor"),
           limit: limit === null ? undefined : Number(limit) };
}

export async function runConformance(baseUrl: string, cases: Case[], headers: Record<string, string> = {}): Promise<Outcome> {
  let last: Reply | undefined;
  const client = new EnvfoundryClient(baseUrl, { headers, onReply: (reply) => (last = reply) });
  const captured: Json = { run_id: randomUUID() };
  const outcome: Outcome = { passed: 0, failed: 0, typed: 0, lines: [] };
  for (const item of cases) {
    try {
      const request = substitute(item.request, captured) as Case["request"];
      const expect = substitute(item.expect, captured) as Case["expect"];
      last = undefined;
      const route = typedRoute(request);
      let reply: Reply;
      if (route) {
        reply = await throughMethod(client, route, request, () => last);
        outcome.typed += 1;
      } else if (request.body_size !== undefined) {
        reply = await sendOversized(baseUrl, request, headers);
      } else {
        reply = await client.send(request.method, request.path, { ...request, body: rawBody(request) });
      }
      check(expect, reply);
      for (const [name, path] of Object.entries(item.capture ?? {})) captured[name] = capture(path, reply);
      outcome.passed += 1;
      outcome.lines.push(`ok - ${item.name}`);
    } catch (error) {
      outcome.failed += 1;
      outcome.lines.push(`not ok - ${item.name}: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
  outcome.lines.push(`conformance: ${outcome.passed} passed, ${outcome.failed} failed`);
  return outcome;
}

function rawBody(request: Case["request"]): string | undefined {
  const r = request.body_repeat;
  return r ? r.prefix + Array(r.count).fill(r.item).join(r.separator) + r.suffix : request.body;
}

function typedRoute(request: Case["request"]): [Route, string[]] | undefined {
  const headers = Object.keys(request.headers ?? {}).map((name) => name.toLowerCase());
  const raw = request.body !== undefined || request.body_repeat !== undefined || request.body_size !== undefined;
  if (raw || headers.some((h) => h !== "idempotency-key")) {
    return undefined;
  }
  const path = request.path.split("?")[0]!;
  for (const route of ROUTES) {
    const found = route[0] === request.method ? route[1].exec(path) : null;
    if (found) return [route, found.slice(1).map(decodeURIComponent)];
  }
  return undefined;
}

async function throughMethod(client: EnvfoundryClient, [route, ids]: [Route, string[]], request: Case["request"],
                             observed: () => Reply | undefined): Promise<Reply> {
  let answer: unknown;
  let thrown: unknown;
  const key = Object.entries(request.headers ?? {}).find(([name]) => name.toLowerCase() === "idempotency-key")?.[1];
  const query = new URLSearchParams(request.path.split("?")[1] ?? "");
  try {
    answer = await route[2](client, ids, request.json, key === undefined ? undefined : { idempotencyKey: key }, query);
  } catch (error) {
    thrown = error;
  }
  const reply = observed();
  if (!reply) throw thrown ?? new Mismatch("the method sent no request");
  if (reply.method !== request.method || reply.path.split("?")[0] !== encodePath(request.path)
      || new URLSearchParams(reply.path.split("?")[1] ?? "").toString() !== query.toString()) {
    throw new Mismatch(`the method sent ${reply.method} ${reply.path}, the case ${request.method} ${request.path}`);
  }
  const success = reply.status >= 200 && reply.status < 300;
  if (success && thrown !== undefined) throw thrown;
  if (success && answer !== reply.body) throw new Mismatch("the method did not answer the body it received");
  if (!success) {
    if (!(thrown instanceof ProblemError)) throw new Mismatch(`HTTP ${reply.status} did not throw a ProblemError`);
    const body = reply.body as Json | undefined;
    if (thrown.status !== reply.status || thrown.type !== body?.type) {
      throw new Mismatch(`the ProblemError says ${thrown.status} ${thrown.type}, the response ${reply.status} ${String(body?.type)}`);
    }
  }
  return reply;
}

function encodePath(path: string): string {
  return path.split("?")[0]!.split("/").map((part) => encodeURIComponent(decodeURIComponent(part))).join("/");
}

/** A body of `body_size` bytes, sent only if the server asks for it with `100 Continue`. */
function sendOversized(baseUrl: string, request: Case["request"], headers: Record<string, string>): Promise<Reply> {
  const url = new URL(baseUrl.replace(/\/+$/, "") + request.path);
  const size = request.body_size ?? 0;
  const send = url.protocol === "https:" ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = send(url, {
      method: request.method,
      headers: { ...headers, ...request.headers, "content-length": String(size), expect: "100-continue" },
    });
    req.on("continue", () => req.end(Buffer.alloc(size, 0x20)));
    req.on("response", (response) => {
      const chunks: Buffer[] = [];
      response.on("data", (chunk: Buffer) => chunks.push(chunk));
      response.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        const contentType = String(response.headers["content-type"] ?? "");
        const replyHeaders = Object.fromEntries(Object.entries(response.headers).map(([k, v]) => [k, String(v)]));
        resolve({ method: request.method, path: request.path, status: response.statusCode ?? 0, contentType,
                  headers: replyHeaders, body: text ? JSON.parse(text) : undefined });
        req.destroy();
      });
    });
    req.on("error", reject);
    req.flushHeaders();
  });
}

export function substitute(value: unknown, captured: Json): unknown {
  if (typeof value === "string") {
    const whole = /^\{\{(\w+)\}\}$/.exec(value);
    if (whole) return lookup(captured, whole[1]!);
    return value.replace(/\{\{(\w+)\}\}/g, (_, name: string) => String(lookup(captured, name)));
  }
  if (Array.isArray(value)) return value.map((v) => substitute(v, captured));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, captured)]));
  }
  return value;
}

function lookup(captured: Json, name: string): unknown {
  if (!(name in captured)) throw new Mismatch(`nothing captured as ${name}`);
  return captured[name];
}

export function typeOf(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

const show = (value: unknown): string => (JSON.stringify(value) ?? "undefined").slice(0, 200);

/** Throws a Mismatch naming the first place where `actual` does not meet `expected`. */
export function match(expected: unknown, actual: unknown, where = "body"): void {
  if (expected !== null && typeof expected === "object" && !Array.isArray(expected)) {
    const keys = Object.keys(expected);
    if (keys.length === 1 && keys[0]!.startsWith("$")) return matcher(keys[0]!, (expected as Json)[keys[0]!], actual, where);
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) {
      throw new Mismatch(`${where}: expected an object, got ${show(actual)}`);
    }
    for (const key of keys) {
      const wanted = (expected as Json)[key];
      if (isAbsent(wanted)) {
        if (key in actual) throw new Mismatch(`${where}.${key}: expected absent, got ${show((actual as Json)[key])}`);
      } else if (!(key in actual)) {
        throw new Mismatch(`${where}.${key}: missing`);
      } else {
        match(wanted, (actual as Json)[key], `${where}.${key}`);
      }
    }
    return;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      throw new Mismatch(`${where}: expected an array of ${expected.length}, got ${show(actual)}`);
    }
    expected.forEach((e, i) => match(e, actual[i], `${where}.${i}`));
    return;
  }
  if (expected !== actual) throw new Mismatch(`${where}: expected ${JSON.stringify(expected)}, got ${show(actual)}`);
}

function isAbsent(value: unknown): boolean {
  return value !== null && typeof value === "object" && Object.keys(value).length === 1 && (value as Json).$absent === true;
}

function matcher(name: string, arg: unknown, actual: unknown, where: string): void {
  if (name === "$present") return;
  if (name === "$type") {
    const got = typeOf(actual);
    if (!(got === arg || (arg === "number" && got === "integer"))) {
      throw new Mismatch(`${where}: expected type ${String(arg)}, got ${show(actual)}`);
    }
    return;
  }
  if (name === "$length") {
    if (!Array.isArray(actual) || actual.length !== arg) throw new Mismatch(`${where}: expected an array of ${String(arg)}, got ${show(actual)}`);
    return;
  }
  if (name === "$contains" && typeof arg === "string") {
    if (typeof actual !== "string" || !actual.includes(arg)) {
      throw new Mismatch(`${where}: expected a string containing ${JSON.stringify(arg)}, got ${show(actual)}`);
    }
    return;
  }
  if (name === "$contains" && Array.isArray(arg)) {
    if (!Array.isArray(actual)) throw new Mismatch(`${where}: expected an array, got ${show(actual)}`);
    for (const wanted of arg) {
      if (!actual.some((item) => matches(wanted, item))) throw new Mismatch(`${where}: no element matches ${JSON.stringify(wanted)}`);
    }
    return;
  }
  throw new Mismatch(`${where}: unknown matcher ${name}`);
}

function matches(expected: unknown, actual: unknown): boolean {
  try {
    match(expected, actual);
    return true;
  } catch {
    return false;
  }
}

function check(expect: Case["expect"], reply: Reply): void {
  if (reply.status !== expect.status) {
    throw new Mismatch(`status: expected ${expect.status}, got ${reply.status}: ${show(reply.body)}`);
  }
  const media = reply.contentType.split(";")[0]!.trim();
  if (expect.content_type !== undefined && media !== expect.content_type) {
    throw new Mismatch(`content-type: expected ${expect.content_type}, got ${reply.contentType}`);
  }
  if (expect.headers !== undefined) match(expect.headers, reply.headers, "headers");
  if ("body" in expect) match(expect.body, reply.body);
}

function capture(path: string, reply: Reply): unknown {
  let value: unknown = { status: reply.status, content_type: reply.contentType, headers: reply.headers, body: reply.body };
  for (const part of path.split(".")) {
    if (value === null || typeof value !== "object" || !(part in value)) throw new Mismatch(`nothing at ${path} to capture`);
    value = (value as Json)[part];
  }
  return value;
}
