"""Environments and scenarios: the package format, where they are found, what their code may do."""
