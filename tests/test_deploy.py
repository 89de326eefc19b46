"""The Kubernetes manifests: rendered like kustomize does, valid against the Kubernetes schemas, and
setting only variables that service/server/settings.py reads."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from service.server.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge as kustomize applies it to these kinds: maps merge, lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(patch)


def render(folder: Path) -> list[dict[str, Any]]:
    """The subset of kustomize these manifests use: resources, patches, labels and namespace."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - {"apiVersion", "kind", "resources", "patches", "labels", "namespace"}
    assert not unknown, f"{folder}: the test renderer does not support {sorted(unknown)}"
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("patches", []):
        patch = yaml.safe_load((folder / entry["path"]).read_text())
        targets = [i for i, d in enumerate(docs)
                   if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]]
        assert len(targets) == 1, f"{entry['path']} matches {len(targets)} resources"
        docs[targets[0]] = _merge(docs[targets[0]], patch)
    for label in spec.get("labels", []):
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    if "namespace" in spec:
        for doc in docs:
            doc["metadata"]["namespace"] = spec["namespace"]
    return docs


OVERLAYS = {"base": DEPLOY / "base", "trial": DEPLOY / "overlays" / "trial"}


@pytest.fixture(params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(OVERLAYS[request.param])


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def settings_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every ENVFOUNDRY_* variable the API pods get, from ConfigMaps they load and their env lists."""
    deployment = one(docs, "Deployment", "envfoundry-api")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value", "")
    return env


def test_every_manifest_validates_against_the_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in rendered}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "NetworkPolicy", "ConfigMap"} <= kinds
    for doc in rendered:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_every_envfoundry_variable_the_pods_get_is_a_setting_and_parses(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = settings_env(rendered)
    ours = {name for name in env if name.startswith("ENVFOUNDRY_")}
    assert "ENVFOUNDRY_REDIS_URL" in ours and "ENVFOUNDRY_API_KEYS_FILE" in ours
    known = {f"ENVFOUNDRY_{name.upper()}" for name in Settings.model_fields}
    assert ours <= known, f"not settings of service/server/settings.py: {sorted(ours - known)}"
    for name in list(os.environ):
        if name.startswith("ENVFOUNDRY_") or name == "REDIS_URL":
            monkeypatch.delenv(name)
    for name in ours:
        monkeypatch.setenv(name, env[name])
    settings = Settings()
    assert settings.redis_url == env["ENVFOUNDRY_REDIS_URL"]
    assert settings.workers == int(env["ENVFOUNDRY_WORKERS"])


def test_the_api_keys_file_is_the_mounted_secret(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment", "envfoundry-api")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    keys_file = Path(settings_env(rendered)["ENVFOUNDRY_API_KEYS_FILE"])
    volume = next(name for name, path in mounts.items() if keys_file.parent == Path(path))
    assert secrets[volume]["secretName"] == "envfoundry-api-keys"
    assert keys_file.name in {item["path"] for item in secrets[volume]["items"]}


def test_probes_use_readyz_for_readiness_and_healthz_for_liveness(rendered: list[dict[str, Any]]) -> None:
    container = one(rendered, "Deployment", "envfoundry-api")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_the_trial_overlay_runs_redis_in_the_namespace_and_points_the_api_at_it() -> None:
    docs = render(OVERLAYS["trial"])
    redis = one(docs, "StatefulSet", "envfoundry-redis")
    service = one(docs, "Service", redis["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert f"envfoundry-redis-0.{service['metadata']['name']}:6379" in settings_env(docs)["ENVFOUNDRY_REDIS_URL"]
    assert {d["metadata"]["namespace"] for d in docs} == {"envfoundry-trial"}
    egress = one(docs, "NetworkPolicy", "envfoundry-api")["spec"]["egress"]
    assert any(rule.get("to", [{}])[0].get("podSelector", {}).get("matchLabels") ==
               redis["spec"]["template"]["metadata"]["labels"] for rule in egress)
