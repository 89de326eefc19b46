"""Strict parsers of the LLM's answers: fenced blocks, typed JSON answers, and code (classes, methods, checks)."""
