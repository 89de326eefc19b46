"""The verifiers plugin ``envfoundry-verifiers`` (``vf-eval envfoundry-verifiers ...``).

verifiers imports a taskset by its id as a top-level module and takes the Taskset, Env and
Harness subclasses that ``__all__`` names; they live in ``envfoundry_client.verifiers_env``.
"""

from envfoundry_client.verifiers_env import EnvfoundryEnv, EnvfoundryHarness, EnvfoundryTaskset

__all__ = ["EnvfoundryEnv", "EnvfoundryHarness", "EnvfoundryTaskset"]
