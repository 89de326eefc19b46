"""The verifiers plugin ``envfoundry-verifiers`` (``vf-eval envfoundry-verifiers ...``).

verifiers imports a taskset by its id as a top-level module and takes the Taskset, Env and
Harness subclasses that ``__all__`` names; they live in ``envfoundry_client.verifiers_env``, and
their config classes are exported beside them, for a program that builds the run itself.
"""

from envfoundry_client.verifiers_env import (
    EnvfoundryEnv,
    EnvfoundryEnvConfig,
    EnvfoundryHarness,
    EnvfoundryHarnessConfig,
    EnvfoundryTaskset,
    EnvfoundryTasksetConfig,
)

__all__ = ["EnvfoundryEnv", "EnvfoundryEnvConfig", "EnvfoundryHarness", "EnvfoundryHarnessConfig",
           "EnvfoundryTaskset", "EnvfoundryTasksetConfig"]
