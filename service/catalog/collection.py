"""The in-memory catalog: environments and scenarios by id, loaded from package folders or added one by one."""

from __future__ import annotations

from pathlib import Path

from service.catalog.admission import check_turns, parse_check
from service.catalog.folders import read_package
from service.catalog.model import CatalogError, ConflictError, Environment, Scenario


class Catalog:
    """Environments and scenarios by id. Ids are unique across the catalog."""

    def __init__(self) -> None:
        self.environments: dict[str, Environment] = {}
        self.scenarios: dict[str, Scenario] = {}
        self.problems: list[str] = []
        self.origins: dict[str, Path] = {}  # env_id -> the catalog folder it was loaded from
        # Bumped on every change, so indexes built over the catalog know when to rebuild.
        self.version = 0

    def add_environment(self, env: Environment) -> bool:
        """Add ``env``; return False when the same definition is already present.

        Raises:
            ConflictError: the id is taken by different code.
        """
        existing = self.environments.get(env.env_id)
        if existing is not None:
            if existing.code_hash != env.code_hash:
                raise ConflictError(f"environment '{env.env_id}' already exists with different code", field="env_id")
            return False
        self.environments[env.env_id] = env
        return True

    def add_scenario(self, scenario: Scenario) -> bool:
        """Add ``scenario``; return False when an identical one is already present.

        Raises:
            CatalogError: the env is unknown (``field='env_id'``) or a check does not parse.
            ConflictError: the id is taken by a different scenario.
        """
        if scenario.env_id not in self.environments:
            raise CatalogError(f"unknown environment '{scenario.env_id}'", field="env_id")
        for i, check in enumerate(scenario.checklist):
            parse_check(check.check, field_name=f"checklist[{i}].check")
        check_turns(scenario, self.environments[scenario.env_id])
        existing = self.scenarios.get(scenario.scenario_id)
        if existing is not None:
            if existing.to_json() != scenario.to_json():
                raise ConflictError(
                    f"scenario '{scenario.scenario_id}' already exists with different content", field="scenario_id"
                )
            return False
        self.scenarios[scenario.scenario_id] = scenario
        self.version += 1
        return True

    def scenarios_of(self, env_id: str) -> list[Scenario]:
        return [s for s in self.scenarios.values() if s.env_id == env_id]

    def load_dir(self, root: Path) -> None:
        """Load every package under ``root`` (a package folder or a folder of them).

        A broken package or scenario is skipped and described in ``problems``, so one bad
        record does not take a whole catalog down.

        Raises:
            CatalogError: ``root`` is not a folder.
        """
        root = Path(root)
        if not root.is_dir():
            raise CatalogError(f"catalog folder not found: {root}", path=str(root))
        folders = [root] if (root / "env.json").is_file() else sorted(
            p for p in root.iterdir() if (p / "env.json").is_file()
        )
        for folder in folders:
            try:
                env, scenarios, problems = read_package(folder)
                self.add_environment(env)
                self.origins.setdefault(env.env_id, root.resolve())
            except CatalogError as exc:
                self.problems.append(f"{exc.path or folder}: {exc.message} (package skipped)")
                continue
            self.problems.extend(problems)
            for scenario in scenarios:
                try:
                    self.add_scenario(scenario)
                except CatalogError as exc:
                    self.problems.append(f"{exc.path or folder / 'scenarios.jsonl'}: {scenario.scenario_id}: "
                                         f"{exc.message} (scenario skipped)")

