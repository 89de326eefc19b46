"""Runs inside .venv-trl (scripts/peer-venvs): TRL's own GRPOTrainer against a real envfoundry server.

    python trl_peer.py CONFIG_JSON

The model is a random 2-layer Qwen3 with a byte-level BPE tokenizer trained here on the
environment's own text, under TRL's Qwen chat template, so TRL's whole path runs: the prompt
with the tool schemas, ``parse_response`` on the generated tokens, the tool methods of the
factory's class, ``get_reward``, the loss and the optimizer step. Only ``model.generate`` is
scripted: each turn it emits the next call of the plan (the scenario's reference solution after
``misspelled`` calls, whose arguments are wrong) as ``<tool_call>`` tokens, then a final answer.

CONFIG_JSON keys: ``url``; ``env_id``; ``scenarios``; ``steps``; ``misspelled`` (calls to make
first, ``[{"name", "arguments"}]``); ``restart_at`` (the generate call at which to print
``RESTART`` and wait until the test has stopped the server: the rollouts' next calls find it down
while it starts again); ``pause_at`` (the generate call at which to print ``PAUSED`` and sleep,
to be signalled).

Prints ``SESSION <id>`` for every session a rollout opens, and at the end ``RESULT <json>``:
``rewards`` (each ``get_reward()``, None for a rollout reported failed), ``steps`` (the steps its
session held when scored), ``observations`` (tool messages seen), ``warnings``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import time
import warnings
from typing import Any

import httpx
import torch
from datasets import Dataset
from envfoundry_client import Client
from envfoundry_client.factory import dataset_rows, environment_factory
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def wait_until_down(url: str) -> None:
    """Block until the server stops answering (the test is restarting it), for at most 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
        except httpx.HTTPError:
            return
        time.sleep(0.05)
    raise RuntimeError("the server was not restarted")


def tokenizer_for(corpus: list[str]) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1200, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(ADDED)
    tokenizer.chat_template = qwen3_chat_template  # TRL knows it: it sets the parser of tool calls itself
    return tokenizer


def scripted_generate(tokenizer: PreTrainedTokenizerFast, plans: dict[str, list[dict[str, Any]]],
                      seen: list[str], on_call: Any) -> Any:
    """``generate`` that writes the next call of the plan of the task it finds in the prompt."""

    def generate(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        on_call()
        rows = []
        for ids in input_ids.tolist():
            text = tokenizer.decode([i for i in ids if i != tokenizer.pad_token_id], skip_special_tokens=False)
            task = next(t for t in plans if t in text)
            answered = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
            if answered:
                seen.append(answered[-1])
            plan = plans[task]
            if len(answered) < len(plan):
                call = plan[len(answered)]
                reply = f'<tool_call>\n{json.dumps({"name": call["name"], "arguments": call["arguments"]})}\n</tool_call>'
            else:
                reply = "All done."
            rows.append(ids + tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False))
        width = max(len(r) for r in rows)
        return torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])

    return generate


def train(config: dict[str, Any]) -> dict[str, Any]:
    url, env_id = config["url"], config["env_id"]
    with Client(url) as ef:
        environment = ef.get_environment(env_id)
        scenarios = {s: ef.get_scenario(s) for s in config["scenarios"]}
    plans = {s.task: [*config.get("misspelled", []),
                      *({"name": c.name, "arguments": c.arguments} for c in s.reference_solution or [])]
             for s in scenarios.values()}
    rows = [r for r in dataset_rows(url, env_id) if r["scenario_id"] in scenarios]
    corpus = [environment.introduction, *environment.rules, json.dumps(environment.tools), *plans,
              *(json.dumps(p) for p in plans.values())]
    tokenizer = tokenizer_for(corpus)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=32768, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))

    rewards: list[float | None] = []
    steps: list[int] = []
    observations: list[str] = []
    Base = environment_factory(url, env_id)

    class Recorded(Base):  # type: ignore[misc, valid-type]
        """The factory's class, saying which sessions it opens and what it scored."""

        def reset(self, scenario_id: str | None = None, **row: Any) -> str | None:
            task = super().reset(scenario_id, **row)
            print("SESSION", self.session_id, flush=True)
            return task

        def get_reward(self) -> float | None:
            reward = super().get_reward()
            rewards.append(reward)
            if reward is not None:
                steps.append(self._client.get_session(self.session_id).steps)
            return reward

    generated = [0]

    def on_call() -> None:
        generated[0] += 1
        if generated[0] == config.get("restart_at"):
            print("RESTART", flush=True)  # the test restarts the server; the calls that follow find it down
            wait_until_down(url)
        if generated[0] == config.get("pause_at"):
            print("PAUSED", flush=True)
            time.sleep(120)

    model.generate = scripted_generate(tokenizer, plans, observations, on_call)  # type: ignore[method-assign]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, num_generations=2,
        max_steps=config["steps"], max_completion_length=4096, learning_rate=1e-4, beta=0.0, logging_steps=1,
        report_to="none", use_cpu=True, save_strategy="no", seed=0, dataloader_num_workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                              environment_factory=Recorded, args=args)
        trainer.train()
    return {"rewards": rewards, "steps": steps, "observations": observations,
            "warnings": [str(w.message) for w in caught if "envfoundry" in str(w.message)]}


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    outcome = train(json.loads(sys.argv[1]))
    print("RESULT", json.dumps(outcome), flush=True)
