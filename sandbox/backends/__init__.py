"""How workers are started and confined from outside: local processes or hardened containers."""
