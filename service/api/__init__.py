"""Transports: REST, the fast call route, MCP, OpenEnv and the console; wire models in, engine calls out."""
