"""Talking to an OpenAI-compatible LLM: the client, its response cache, token usage and cost, prompt templates, re-asking."""
