"""A catalog's manifest: the version of every environment and scenario it serves, and one digest of it all.

``envfoundry catalog lock DIR`` writes it into the folder (``LOCK_FILE``); a service loading the
folder compares what it finds with it and reports every difference (a drift), so a changed file
never goes unnoticed. Two services serve the same thing exactly when their manifest digests agree
(``GET /v1/catalog/manifest``); a rollout file records the digest it was made against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.catalog.collection import Catalog
from service.catalog.model import CatalogError, content_digest

LOCK_FILE = "envfoundry.lock.json"


def manifest(catalog: Catalog) -> dict[str, Any]:
    """``{"digest", "environments": {id: version}, "scenarios": {id: version}}``, ids in order."""
    body = {"environments": {k: catalog.environments[k].version for k in sorted(catalog.environments)},
            "scenarios": {k: catalog.scenarios[k].version for k in sorted(catalog.scenarios)}}
    return {"digest": content_digest(body), **body}


def lock(folder: Path) -> dict[str, Any]:
    """Write the manifest of the catalog in ``folder`` into it; return the manifest.

    Raises CatalogError: the folder is not a catalog, or some of it does not load (nothing is written:
    a lock of part of a catalog would hide the rest)."""
    catalog = Catalog()
    catalog.load_dir(folder)
    if catalog.problems:
        raise CatalogError(f"{folder}: {len(catalog.problems)} problems; fix them before locking: "
                           f"{catalog.problems[0]}", path=str(folder))
    written = manifest(catalog)
    (folder / LOCK_FILE).write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return written


def drift(folder: Path, catalog: Catalog) -> list[str]:
    """How what ``catalog`` loaded from ``folder`` differs from the folder's lock file (none: [])."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    if not path.is_file():
        return []
    try:
        locked = json.loads(path.read_text())
        kinds = {kind: dict(locked[kind]) for kind in ("environments", "scenarios")}
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: not a manifest ({exc})"]
    found: list[str] = []
    for kind, loaded in (("environments", catalog.environments), ("scenarios", catalog.scenarios)):
        pinned = kinds[kind]
        mine = {k: v.version for k, v in loaded.items() if catalog.origins.get(v.env_id) == folder.resolve()}
        for name in sorted(pinned.keys() | mine.keys()):
            if name not in mine:
                found.append(f"{kind[:-1]} '{name}' is locked at {pinned[name][:12]} but not served")
            elif name not in pinned:
                found.append(f"{kind[:-1]} '{name}' is served ({mine[name][:12]}) but not locked")
            elif pinned[name] != mine[name]:
                found.append(f"{kind[:-1]} '{name}' is locked at {pinned[name][:12]} but serves {mine[name][:12]}")
    return found

