"""envfoundry scenarios as a verifiers (0.4) environment: run with ``vf-eval envfoundry-verifiers``.

    pip install "envfoundry-client[verifiers]"
    vf-eval envfoundry-verifiers --env.taskset.base-url http://127.0.0.1:8000 \\
        --env.taskset.env-ids '["library_circulation"]' -m MODEL --client.base-url URL/v1 -n 5 -r 4 --push False

verifiers resolves a taskset id to a top-level module (``envfoundry-verifiers`` is the
``envfoundry_verifiers`` module of this distribution, which re-exports what is here). That module
exports the three parts verifiers looks for:

- ``EnvfoundryTaskset``: the dataset, one task per scenario of the catalog (every environment, or
  ``env_ids``, or just ``scenario_ids``); the prompt is the scenario's task, the system prompt the
  environment's introduction and rules;
- ``EnvfoundryHarness``: the agent loop, run in the eval process (verifiers allows a harness to
  loop in-process as long as every model call goes through the rollout's interception endpoint,
  so the trace records each turn). It offers the model the session's tools, calls them in the
  session, hands back each observation as the tool message, and ends when the model answers
  without a call. Unlike verifiers' built-in harnesses it installs nothing at run time (no uv);
- ``EnvfoundryEnv``: the single-agent environment with that harness in the subprocess runtime
  (which here is only a scratch folder: the harness launches no program).

Each rollout is one envfoundry session: the task's ``setup`` opens it on the scenario, the
``checks`` reward is ``/score`` (passed checks / checks) on the final state, the metrics
``checks_passed`` and ``checks_total`` say how many, and the harness deletes the session after
scoring (verifiers gives a task no hook after scoring). The API key comes from
``ENVFOUNDRY_API_KEY``, as for every client here, so it never lands in a trace.

verifiers is imported here at module level: import this module only where the ``verifiers`` extra
is installed (the client's own ``import envfoundry_client`` never imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import verifiers.v1 as vf
from pydantic import Field

from envfoundry_client import leases
from envfoundry_client.client import AsyncClient, Client
from envfoundry_client.errors import EnvfoundryError, NotFound
from envfoundry_client.models import Score
from envfoundry_client.text_calls import parse

JSON = dict[str, Any]


class EnvfoundryData(vf.TaskData):
    base_url: str
    env_id: str
    scenario_id: str
    idle_ttl_seconds: float | None = None


class EnvfoundryState(vf.State):
    session_id: str | None = None


class EnvfoundryTasksetConfig(vf.TasksetConfig):
    base_url: str | None = None
    """The envfoundry service (None: ``ENVFOUNDRY_URL``, else http://127.0.0.1:8000)."""
    env_ids: list[str] = Field(default_factory=list)
    """Environments whose scenarios are tasks (empty: every environment of the catalog)."""
    scenario_ids: list[str] = Field(default_factory=list)
    """Only these scenarios, in this order (empty: all of the chosen environments)."""
    idle_ttl_seconds: float | None = Field(default=None, ge=1)
    """Each rollout's session expires this long after its last call (None: ``ENVFOUNDRY_SESSION_IDLE_SECONDS``,
    else the service's TTL), so what a killed run leaves is reaped soon."""


class EnvfoundryTask(vf.Task[EnvfoundryData, EnvfoundryState]):
    @property
    def key(self) -> str:
        return str(self.data.scenario_id)

    async def setup(self, trace: vf.Trace) -> None:
        """Open this rollout's session on the scenario."""
        async with AsyncClient(self.data.base_url) as ef:
            session = await ef.create_session(self.data.scenario_id, idle_ttl_seconds=self.data.idle_ttl_seconds)
            leases.hold(ef.config, session.session_id)  # deleted at exit or on SIGTERM if cleanup never runs
        trace.state.session_id = session.session_id
        trace.info["envfoundry_session_id"] = session.session_id  # the state is not saved with the trace

    @vf.reward
    async def checks(self, trace: vf.Trace) -> float:
        """The scenario's checks on the session's final state: passed / total.

        Raises:
            ValueError: the scenario has no checks, so there is nothing to score.
        """
        score = await _score(self.data.base_url, _session(trace))
        if score.reward is None:
            raise ValueError(f"scenario {self.data.scenario_id} has no checks: nothing to score")
        return float(score.reward)

    @vf.metric
    async def counts(self, trace: vf.Trace) -> dict[str, float]:
        score = await _score(self.data.base_url, _session(trace))
        return {"checks_passed": float(score.passed), "checks_total": float(score.total)}


class EnvfoundryTaskset(vf.Taskset[EnvfoundryTask, EnvfoundryTasksetConfig]):
    def load(self) -> Iterator[EnvfoundryTask]:
        leases.install()  # signal handlers can only be set from the main thread, where the taskset loads
        with Client(self.config.base_url) as ef:
            base_url = ef.config.base_url
            env_ids = self.config.env_ids or [e.env_id for e in ef.list_environments()]
            environments = {env_id: ef.get_environment(env_id) for env_id in env_ids}
            scenarios = [s for env_id in env_ids for s in ef.list_scenarios(env_id)]
            if self.config.scenario_ids:
                by_id = {s.scenario_id: s for s in scenarios}
                missing = [s for s in self.config.scenario_ids if s not in by_id]
                if missing:
                    raise ValueError(f"scenario_ids not in the chosen environments {env_ids}: {missing}")
                scenarios = [by_id[s] for s in self.config.scenario_ids]
        for scenario in scenarios:
            environment = environments[scenario.env_id]
            rules = "\n".join(f"- {rule}" for rule in environment.rules)
            system = f"{environment.introduction}\n\nRules:\n{rules}" if rules else environment.introduction
            yield EnvfoundryTask(EnvfoundryData(
                id=scenario.scenario_id, name=scenario.scenario_id, prompt=scenario.task, system_prompt=system,
                base_url=base_url, env_id=scenario.env_id, scenario_id=scenario.scenario_id,
                idle_ttl_seconds=self.config.idle_ttl_seconds), self.config.task)


class EnvfoundryHarnessConfig(vf.HarnessConfig):
    max_turns: int = Field(40, ge=1)
    """Model turns a rollout may take before the loop stops it. verifiers parses the harness's own flags
    only when the harness is named (``--env.agent.harness.id envfoundry-verifiers
    --env.agent.harness.max-turns N``); ``--env.agent.max-turns N`` works without it."""
    model_timeout: float = Field(300.0, gt=0)
    """Seconds to wait for one model answer."""


class EnvfoundryHarness(vf.Harness[EnvfoundryHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = False
    EXECUTES_CODE = False  # the model gets the environment's tools, no shell
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[JSON] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            raise TypeError("an envfoundry task's prompt is its task text")
        base_url = str(data.base_url)
        session_id = _session(trace)
        async with AsyncClient(base_url) as ef, httpx.AsyncClient(
                base_url=endpoint, headers={"Authorization": f"Bearer {secret}"},
                timeout=self.config.model_timeout) as model:
            tools = await ef.tools(session_id)
            for _ in range(self.config.max_turns):
                answer = await model.post("/chat/completions", json={
                    "model": ctx.model, "messages": messages, "tools": tools})
                if answer.status_code != 200:
                    # the interception has recorded why on the trace (a limit, a @stop, the model's
                    # own error as a ProviderError); verifiers reads this exit in that light
                    return vf.ProgramResult(1, "", f"model request answered {answer.status_code}: {answer.text}")
                message = answer.json()["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                messages.append({"role": "assistant", "content": message.get("content"),
                                 **({"tool_calls": calls} if calls else {})})
                if not calls:
                    written = await _text_calls(ef, session_id, message.get("content") or "")
                    if isinstance(written, vf.ProgramResult):
                        return written
                    if written is None:
                        return vf.ProgramResult(0, message.get("content") or "", "")
                    messages.append(written)
                    continue
                for call in calls:
                    function = call.get("function") or {}
                    # a refused or malformed call is the environment's observation: the model sees it;
                    # a failure of the service (a lost session, no answer within the retry budget)
                    # ends the rollout as the harness's error, saying so, rather than being scored
                    try:
                        result = await ef.call(session_id, str(function.get("name")),
                                               function.get("arguments") or "{}")
                    except EnvfoundryError as exc:
                        return vf.ProgramResult(1, "", _service_failure(session_id, exc))
                    messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result.observation})
        trace.stop("max_turns")
        return vf.ProgramResult(0, "", "")

    async def cleanup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        session_id = getattr(trace.state, "session_id", None)
        if session_id is None:
            return
        base_url = str(trace.task.data.base_url)
        try:
            async with AsyncClient(base_url) as ef:
                await ef.delete_session(session_id)
        except NotFound:
            leases.release(session_id)  # expired or deleted elsewhere: nothing is left
        except (EnvfoundryError, RuntimeError):
            pass  # the service down past the retry budget: leases tries again at exit, then its TTL reaps it
        else:
            leases.release(session_id)
        trace.state.session_id = None


class EnvfoundryEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The one seat; its harness defaults to ``EnvfoundryHarness`` (the taskset exports it)."""


class EnvfoundryEnv(vf.Env[EnvfoundryEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


async def _text_calls(ef: AsyncClient, session_id: str, content: str) -> JSON | vf.ProgramResult | None:
    """Run the calls a model wrote as ``<tool_call>`` text (see ``text_calls``), in order; their
    observations go back as one user message of ``<tool_response>`` blocks, as the chat templates
    of such models render tool results. None: the text holds no call (the answer). A block that is
    not a call is answered with why, and costs the session nothing."""
    _, written = parse(content)
    if not written:
        return None
    responses = []
    for call in written:
        if call.name is None:
            responses.append(f"<tool_response>\nError: {call.problem}; nothing was called.\n</tool_response>")
            continue
        try:
            result = await ef.call(session_id, call.name, call.arguments)
        except EnvfoundryError as exc:
            return vf.ProgramResult(1, "", _service_failure(session_id, exc))
        responses.append(f"<tool_response>\n{result.observation}\n</tool_response>")
    return {"role": "user", "content": "\n".join(responses)}


def _session(trace: vf.Trace) -> str:
    session_id = getattr(trace.state, "session_id", None)
    if not isinstance(session_id, str):
        raise RuntimeError("the rollout has no envfoundry session: the task's setup did not run")
    return session_id


async def _score(base_url: str, session_id: str) -> Score:
    async with AsyncClient(base_url) as ef:
        try:
            return await ef.score(session_id)
        except EnvfoundryError as exc:
            raise RuntimeError(_service_failure(session_id, exc)) from exc


def _service_failure(session_id: str, exc: EnvfoundryError) -> str:
    """What a rollout that failed outside the agent says: it is not scored."""
    if isinstance(exc, NotFound):
        why = "is gone: the service restarted on a memory store, or the session expired"
    else:
        why = f"failed: {exc}"
    return f"envfoundry session {session_id} {why}; this rollout cannot be scored"


__all__ = ["EnvfoundryData", "EnvfoundryEnv", "EnvfoundryEnvConfig", "EnvfoundryHarness", "EnvfoundryHarnessConfig",
           "EnvfoundryState", "EnvfoundryTask", "EnvfoundryTaskset", "EnvfoundryTasksetConfig"]
