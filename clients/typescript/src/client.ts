/**
 * The envfoundry REST API v1 over Node's built-in fetch. Types come from schema.d.ts, which is
 * generated from openapi/openapi.json (`npm run generate`); a test fails when it drifts.
 */
import { problemError } from "./problem.js";
import type { components } from "./schema.js";

type Schemas = components["schemas"];
export type Health = Schemas["Health"];
export type EnvironmentList = Schemas["EnvironmentList"];
export type EnvironmentDetail = Schemas["EnvironmentDetail"];
export type EnvironmentCreate = Schemas["EnvironmentCreate"];
export type EnvironmentVersions = Schemas["EnvironmentVersions"];
export type CatalogManifest = Schemas["CatalogManifest"];
export type ScenarioList = Schemas["ScenarioList"];
export type ScenarioSummary = Schemas["ScenarioSummary"];
export type ScenarioDetail = Schemas["ScenarioDetail"];
export type ScenarioCreate = Schemas["ScenarioCreate"];
export type SessionCreate = Schemas["SessionCreate"];
export type SessionCreated = Schemas["SessionCreated"];
export type SessionInfo = Schemas["SessionInfo"];
export type SessionList = Schemas["SessionList"];
export type ToolList = Schemas["ToolList"];
export type ToolCallRequest = Schemas["ToolCallRequest"];
export type CallResult = Schemas["CallResult"];
export type ForkRequest = Schemas["ForkRequest"];
export type MessageRequest = Schemas["MessageRequest"];
export type MessageResult = Schemas["MessageResult"];
export type Step = Schemas["Step"];
export type MessageStep = Schemas["MessageStep"];
export type StateView = Schemas["StateView"];
export type Trajectory = Schemas["Trajectory"];
export type Score = Schemas["Score"];
export type TurnEnd = Schemas["TurnEnd"];
export type TurnView = Schemas["TurnView"];
export type TurnResult = Schemas["TurnResult"];
export type TurnScore = Schemas["TurnScore"];
export type TurnSpec = Schemas["TurnSpec"];

/** One HTTP exchange as the client saw it. */
export interface Reply {
  method: string;
  path: string;
  status: number;
  contentType: string;
  /** Lower-case names; e.g. `idempotent-replayed: true` when a keyed retry got the first answer. */
  headers: Record<string, string>;
  body: unknown;
}

/** Options of the requests that change a session. */
export interface Once {
  /** Sent as `Idempotency-Key`: a retry with the same key and body gets the first answer, applied once. */
  idempotencyKey?: string;
}

function keyed(once: Once | undefined): Record<string, string> | undefined {
  return once?.idempotencyKey === undefined ? undefined : { "idempotency-key": once.idempotencyKey };
}

export interface RequestInit {
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as is (a raw body, e.g. to test how the service treats malformed JSON). */
  body?: string;
  headers?: Record<string, string>;
}

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <token>` on every request. */
  token?: string;
  /** Added to every request. */
  headers?: Record<string, string>;
  /** Milliseconds before a request is abandoned (default 120 000: a call may wait for the session's lock). */
  timeoutMs?: number;
  /** Sees every exchange: for logging, metrics, or checking the raw status. */
  onReply?: (reply: Reply) => void;
  /** A fetch of your own (defaults to the global one). */
  fetch?: typeof fetch;
}

export class EnvfoundryClient {
  readonly baseUrl: string;
  private readonly options: ClientOptions;

  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.options = options;
  }

  // -- environments and scenarios ---------------------------------------------------------
  health(): Promise<Health> {
    return this.json("GET", "/healthz");
  }

  /** `{status: "ready"}` while the store and the sandbox answer; 503 `unavailable` otherwise. */
  ready(): Promise<{ status: string }> {
    return this.json("GET", "/readyz");
  }

  listEnvironments(): Promise<EnvironmentList> {
    return this.json("GET", "/v1/environments");
  }

  getEnvironment(envId: string): Promise<EnvironmentDetail> {
    return this.json("GET", `/v1/environments/${seg(envId)}`);
  }

  /** Every version of an environment, oldest first, with the tools each added, removed and changed. */
  environmentVersions(envId: string): Promise<EnvironmentVersions> {
    return this.json("GET", `/v1/environments/${seg(envId)}/versions`);
  }

  /** The version of everything the loaded catalogs serve, one digest of it all, and any drift from their lock files. */
  catalogManifest(): Promise<CatalogManifest> {
    return this.json("GET", "/v1/catalog/manifest");
  }

  /**
   * Add an environment from code; it is validated in the sandbox before it is accepted. Other code
   * under an existing id is that id's new, latest version (`envId@label` or `envId@<digest prefix>`
   * names one version).
   */
  createEnvironment(body: EnvironmentCreate): Promise<EnvironmentDetail> {
    return this.json("POST", "/v1/environments", { json: body });
  }

  /** Remove an environment this key's tenant added (scope `admin`); its sessions are gone (404) from then on. */
  async deleteEnvironment(envId: string): Promise<void> {
    await this.json("DELETE", `/v1/environments/${seg(envId)}`);
  }

  /** One environment's scenarios by id, one page (without `limit`, as many as a page holds: 1000). */
  listScenarios(envId: string, filter: Omit<ScenarioFilter, "env"> = {}): Promise<ScenarioList> {
    return this.json("GET", `/v1/environments/${seg(envId)}/scenarios${query({ ...filter, env: undefined })}`);
  }

  /**
   * One page of the scenarios served, by id, filtered by environment, split and tags (all given
   * tags must be carried). Pass the page's `next_cursor` as `cursor`, with the same filters, for the
   * next; `total` counts every page.
   */
  findScenarios(filter: ScenarioFilter = {}): Promise<ScenarioList> {
    return this.json("GET", `/v1/scenarios${query(filter)}`);
  }

  /** Every scenario the filters select, by id, fetched a page (`limit`, default 500) at a time. */
  async *iterScenarios(filter: Omit<ScenarioFilter, "cursor"> = {}): AsyncGenerator<ScenarioSummary> {
    let cursor: string | undefined;
    do {
      const page = await this.findScenarios({ limit: 500, ...filter, cursor });
      yield* page.scenarios;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  getScenario(scenarioId: string): Promise<ScenarioDetail> {
    return this.json("GET", `/v1/scenarios/${seg(scenarioId)}`);
  }

  createScenario(body: ScenarioCreate): Promise<ScenarioDetail> {
    return this.json("POST", "/v1/scenarios", { json: body });
  }

  /** Remove a scenario this key's tenant added (scope `admin`). */
  async deleteScenario(scenarioId: string): Promise<void> {
    await this.json("DELETE", `/v1/scenarios/${seg(scenarioId)}`);
  }

  // -- sessions -----------------------------------------------------------------------------
  /**
   * `{scenario_id}` or `{env_id, init_config?}`: the answer carries the task, the rules and the tools.
   * `n` makes a group from one initial state (`session_ids`); `mode: "conversation"` puts a simulated
   * user in front of the task (talk to it with `message`).
   */
  createSession(body: SessionCreate, once?: Once): Promise<SessionCreated> {
    return this.json("POST", "/v1/sessions", { json: body, headers: keyed(once) });
  }

  /** This tenant's live sessions, the next to expire first, a page at a time. */
  listSessions(page: { offset?: number; limit?: number } = {}): Promise<SessionList> {
    return this.json("GET", `/v1/sessions${query(page)}`);
  }

  getSession(sessionId: string): Promise<SessionInfo> {
    return this.json("GET", `/v1/sessions/${seg(sessionId)}`);
  }

  tools(sessionId: string): Promise<ToolList> {
    return this.json("GET", `/v1/sessions/${seg(sessionId)}/tools`);
  }

  /**
   * Call a tool. `ok` is true when the tool ran and answered, a refusal (`{"success": false, ...}`)
   * included, which is in `result`. A call that produced no answer is not an exception either: `ok`
   * is false, `error.type` says why (`unknown_tool`, `invalid_arguments`, `tool_exception`,
   * `timeout`, ...), and the state is as before. `args` may be an object or the JSON string an
   * OpenAI tool call carries.
   */
  call(sessionId: string, name: string, args: Record<string, unknown> | string = {}, once?: Once): Promise<CallResult> {
    return this.callWith(sessionId, { name, arguments: args }, once);
  }

  /** `call` with the request body as the API defines it. */
  callWith(sessionId: string, body: ToolCallRequest, once?: Once): Promise<CallResult> {
    return this.json("POST", `/v1/sessions/${seg(sessionId)}/calls`, { json: body, headers: keyed(once) });
  }

  /** Conversation mode: say something to the simulated user; `done` means it ended the conversation. */
  message(sessionId: string, content: string, once?: Once): Promise<MessageResult> {
    return this.messageWith(sessionId, { content }, once);
  }

  messageWith(sessionId: string, body: MessageRequest, once?: Once): Promise<MessageResult> {
    return this.json("POST", `/v1/sessions/${seg(sessionId)}/messages`, { json: body, headers: keyed(once) });
  }

  /**
   * Turn-based scenarios: the turn in progress (`null` once `done`), its user message and the tools
   * available in it. Throws NotTurnBasedError for a session whose scenario has no turns.
   */
  turn(sessionId: string): Promise<TurnView> {
    return this.json("GET", `/v1/sessions/${seg(sessionId)}/turns`);
  }

  /**
   * Turn-based scenarios: end the turn in progress, with the agent's closing message if any (the
   * turn's checks read it). The answer is the next user message and the tools that arrive with it,
   * or `done` after the last turn. Throws TurnsEndedError once every turn has ended and
   * NotTurnBasedError for a session without turns.
   */
  endTurn(sessionId: string, content?: string, once?: Once): Promise<TurnResult> {
    return this.endTurnWith(sessionId, content === undefined ? {} : { content }, once);
  }

  endTurnWith(sessionId: string, body: TurnEnd, once?: Once): Promise<TurnResult> {
    return this.json("POST", `/v1/sessions/${seg(sessionId)}/turns`, { json: body, headers: keyed(once) });
  }

  /** The current state, or with `step` the state after that step (0: the initial state). */
  state(sessionId: string, step?: number): Promise<StateView> {
    return this.json("GET", `/v1/sessions/${seg(sessionId)}/state${query({ step })}`);
  }

  /** A page of steps (`offset` 0 and the service's largest page by default) with the whole `total`. */
  trajectory(sessionId: string, page: { offset?: number; limit?: number } = {}): Promise<Trajectory> {
    return this.json("GET", `/v1/sessions/${seg(sessionId)}/trajectory${query(page)}`);
  }

  /** Score against the scenario's checks; the session goes on. A turn-based session's score has each
   * turn's checks in `turns` and the episode's reward under `aggregation`. */
  score(sessionId: string): Promise<Score> {
    return this.json("POST", `/v1/sessions/${seg(sessionId)}/score`);
  }

  /** New, independent sessions (`n`, default 1) with a copy of the state and trajectory; with
   * `step`, at the state after that step with the trajectory's first `step` steps. */
  fork(sessionId: string, body?: ForkRequest, once?: Once): Promise<SessionCreated> {
    return this.json("POST", `/v1/sessions/${seg(sessionId)}/fork`, { json: body, headers: keyed(once) });
  }

  async deleteSession(sessionId: string): Promise<void> {
    await this.json("DELETE", `/v1/sessions/${seg(sessionId)}`);
  }

  // -- transport ----------------------------------------------------------------------------
  /**
   * Send one request and answer what came back, whatever the status.
   *
   * @throws TypeError (from fetch) when the server cannot be reached.
   */
  async send(method: string, path: string, init: RequestInit = {}): Promise<Reply> {
    const headers: Record<string, string> = { accept: "application/json, application/problem+json" };
    if (this.options.token) headers.authorization = `Bearer ${this.options.token}`;
    Object.assign(headers, this.options.headers, init.headers);
    let body: string | undefined = init.body;
    if (init.json !== undefined) {
      body = JSON.stringify(init.json);
      headers["content-type"] ??= "application/json";
    }
    const doFetch = this.options.fetch ?? fetch;
    const response = await doFetch(this.baseUrl + path, {
      method,
      headers,
      body,
      signal: AbortSignal.timeout(this.options.timeoutMs ?? 120_000),
    });
    const text = await response.text();
    const contentType = response.headers.get("content-type") ?? "";
    const replyHeaders: Record<string, string> = {};
    response.headers.forEach((value, name) => (replyHeaders[name.toLowerCase()] = value));
    const reply: Reply = {
      method, path, status: response.status, contentType, headers: replyHeaders, body: parse(text, contentType),
    };
    this.options.onReply?.(reply);
    return reply;
  }

  /**
   * `send`, then the body of a 2xx answer (undefined for 204).
   *
   * @throws ProblemError (a subclass per problem type) for any other status.
   */
  async json<T>(method: string, path: string, init: RequestInit = {}): Promise<T> {
    const reply = await this.send(method, path, init);
    if (reply.status < 200 || reply.status >= 300) throw problemError(reply.status, reply.body);
    return reply.body as T;
  }
}

/** What `findScenarios` selects; `tag` may repeat (a scenario must carry every one). */
export type ScenarioFilter = {
  env?: string;
  split?: string;
  tag?: string | string[];
  limit?: number;
  cursor?: string;
};

function query(values: Record<string, number | string | string[] | undefined>): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(values)) {
    for (const one of Array.isArray(value) ? value : value === undefined ? [] : [value]) {
      params.append(name, String(one));
    }
  }
  return params.size ? `?${params}` : "";
}

function seg(value: string): string {
  return encodeURIComponent(value);
}

function parse(text: string, contentType: string): unknown {
  if (!text) return undefined;
  if (/json/i.test(contentType)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text;
}
