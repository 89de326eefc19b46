"""What an environment may import: the standard library, and the packages it declares and the
operator allows.

An environment declares ``requirements`` (PEP 508 names, optionally with versions:
``mpmath==1.3.0``, ``pydantic>=2.7,<3``); the operator lists what may be installed in
``ENVFOUNDRY_ALLOWED_REQUIREMENTS`` (same syntax). A requirement is data, never a place: a project
name and PEP 440 versions with ``==``, ``!=``, ``>=``, ``<=``, ``<``, ``>``, ``~=`` (a ``.*``
wildcard with ``==`` and ``!=``, a local ``+label`` where PEP 440 allows one, i.e. with ``==`` and
``!=`` too). No ``===`` (it compares any text, and pip reads text with a ``/`` as a folder to
build), URL, marker or extras. What pip is given is rendered again from the parsed name and
versions, never the declared text. A declared requirement is allowed when the
allow-list names the same project; it is installed within both version ranges at once, so the
operator's bounds always hold. Imports are read from the code's syntax tree (nothing runs): a
top-level import of anything outside the standard library that no declared package provides is
refused at registration, before the sandbox ever loads the code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from service.catalog.collection import Catalog
from service.catalog.model import CatalogError, Environment

if TYPE_CHECKING:
    from service.catalog.packages.layers import Layers

SETTING = "ENVFOUNDRY_ALLOWED_REQUIREMENTS"
MAX_REQUIREMENTS = 32
MAX_REQUIREMENT_LENGTH = 200
OPERATORS = ("==", "!=", ">=", "<=", "<", ">", "~=")
WILDCARD_OPERATORS = ("==", "!=")


@dataclass(frozen=True)
class Pin:
    """One requirement as it will be installed: its project and the versions it may take."""

    name: str  # canonical (PEP 503)
    specifier: str  # "" for any version

    def __str__(self) -> str:
        return f"{self.name}{self.specifier}"


def parse(text: str, *, field: str = "requirements") -> Requirement:
    """A requirement an environment or the allow-list may name: a project and versions, nothing
    else (a URL, a path or a marker would say where or when to install; the service decides both).
    The result is built again from the parsed parts: a canonical name and normalized versions.

    Raises:
        CatalogError: ``reason='invalid_requirement'``, naming the text.
    """
    if not isinstance(text, str) or len(text) > MAX_REQUIREMENT_LENGTH:
        raise CatalogError(f"{field}: a requirement is a string of at most {MAX_REQUIREMENT_LENGTH} characters",
                           field=field, reason="invalid_requirement")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise CatalogError(f"{field}: {text!r} is not a PEP 508 requirement ({exc})", field=field,
                           reason="invalid_requirement") from None
    if requirement.url or requirement.marker or requirement.extras:
        raise CatalogError(f"{field}: {text!r} may name a project and versions only (no URL, marker or extras)",
                           field=field, reason="invalid_requirement")
    versions = []
    for specifier in requirement.specifier:
        clean = _version(specifier)
        if clean is None:
            raise CatalogError(f"{field}: {text!r} may compare versions only with {' '.join(OPERATORS)} and "
                               f"PEP 440 versions ({str(specifier)!r} is not one)", field=field,
                               reason="invalid_requirement")
        versions.append(clean)
    return Requirement(canonicalize_name(requirement.name) + ",".join(sorted(versions)))


def _version(specifier: Specifier) -> str | None:
    """``specifier`` rendered from its parsed operator and version, or None when it is not an
    operator of OPERATORS with a PEP 440 version (``===`` compares arbitrary text)."""
    if specifier.operator not in OPERATORS:
        return None
    text = specifier.version
    wildcard = text.endswith(".*") and specifier.operator in WILDCARD_OPERATORS
    try:
        version = Version(text[:-2] if wildcard else text)
    except InvalidVersion:
        return None
    if wildcard and version.local is not None:
        return None
    rendered = f"{specifier.operator}{version}{'.*' if wildcard else ''}"
    try:
        Specifier(rendered)  # (the grammar's rules: a local version or ~= with one part are refused)
    except ValueError:
        return None
    return rendered


class AllowList:
    """The operator's allowed requirements, by project."""

    def __init__(self, entries: list[str]) -> None:
        self.entries: dict[str, Requirement] = {}
        for entry in entries:
            requirement = parse(entry, field=SETTING)
            self.entries[canonicalize_name(requirement.name)] = requirement

    def __bool__(self) -> bool:
        return bool(self.entries)

    def pins(self, declared: list[str]) -> list[Pin]:
        """What to install for ``declared``, sorted by project.

        Raises:
            CatalogError: a requirement is malformed (``invalid_requirement``), named twice, or not
            allowed (``requirement_not_allowed``, naming it and the setting).
        """
        if len(declared) > MAX_REQUIREMENTS:
            raise CatalogError(f"requirements: at most {MAX_REQUIREMENTS}", field="requirements",
                               reason="invalid_requirement")
        pins: dict[str, Pin] = {}
        for i, text in enumerate(declared):
            requirement = parse(text, field=f"requirements[{i}]")
            name = canonicalize_name(requirement.name)
            if name in pins:
                raise CatalogError(f"requirements[{i}]: {name} is named twice", field=f"requirements[{i}]",
                                   reason="invalid_requirement")
            allowed = self.entries.get(name)
            if allowed is None:
                listed = ", ".join(str(r) for r in self.entries.values()) or "nothing"
                raise CatalogError(f"requirements[{i}]: {text!r} is not allowed on this service ({SETTING} "
                                   f"allows {listed})", field=f"requirements[{i}]", reason="requirement_not_allowed")
            both: SpecifierSet = requirement.specifier & allowed.specifier  # (both parsed by parse())
            pins[name] = Pin(name, ",".join(sorted(str(s) for s in both)))
        return [pins[name] for name in sorted(pins)]


def check_imports(imports: list[str], provided: set[str], declared: list[str]) -> None:
    """Raises CatalogError (``undeclared_import``) naming the first import nothing provides."""
    for name in imports:
        if name not in provided:
            if declared:
                hint = f"none of its requirements ({', '.join(declared)}) provides it"
            else:
                hint = f"declare the package in 'requirements' (allowed by {SETTING})"
            raise CatalogError(f"the code imports '{name}', which is not in the standard library; {hint}",
                               field="requirements", reason="undeclared_import")


class Packages:
    """What the service installs for environments: the allow-list and the layers built from it."""

    def __init__(self, allowed: AllowList, layers: Layers | None) -> None:
        self.allowed = allowed
        self.layers = layers  # None when nothing is allowed

    async def attach(self, env: Environment) -> Environment:
        """``env`` with the layer of its requirements (built if need be).

        Raises:
            CatalogError: a requirement is malformed or not allowed, cannot be installed, or the
            code imports a package it does not declare; ``reason`` and ``field`` say which.
        """
        if not env.requirements:
            check_imports(env.imports, set(), [])
            return env
        pins = self.allowed.pins(env.requirements)
        assert self.layers is not None  # pins() allowed something, so layers exist
        layer = await self.layers.ensure(pins)
        check_imports(env.imports, set(layer.modules), env.requirements)
        return replace(env, layers=(layer.site,))

    async def attach_catalog(self, catalog: Catalog) -> list[str]:
        """Attach every loaded environment's layer; one that cannot have it is dropped with its
        scenarios (as a broken package is), and described in the returned problems."""
        problems = []
        for env_id, env in list(catalog.environments.items()):
            try:
                catalog.environments[env_id] = await self.attach(env)
            except CatalogError as exc:
                del catalog.environments[env_id]
                dropped = [s for s, scenario in catalog.scenarios.items() if scenario.env_id == env_id]
                for scenario_id in dropped:
                    del catalog.scenarios[scenario_id]
                problems.append(f"{env_id}: {exc.reason}: {exc.message} (package and its {len(dropped)} "
                                "scenarios skipped)")
        return problems
