"""Synthesis: turn a corpus of task texts into environment packages with an OpenAI-compatible LLM.

The EnvScaler method (theme mining, skeleton synthesis, dual-agent assessment,
scenario generation) plus a validation stage that replays a reference solution
in the sandbox. See ``synthesis/README.md``.
"""
