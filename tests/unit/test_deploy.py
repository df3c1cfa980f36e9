"""The Kubernetes manifests in deploy/: rendered as kustomize renders them, valid against the
Kubernetes API schemas, and consistent with the server they run (its flags, ports, image, limits).

There is no kubectl or kustomize here, so `render` below is a small kustomize of its own. It does
exactly what deploy/ uses, as kustomize does it (`resources`, and `patches` as strategic merge or
JSON 6902 patches), and refuses everything else, so a kustomization field it does not know can never
be silently ignored: a new one fails these tests until the renderer learns it.

The schemas come with kubernetes-validate, for many Kubernetes versions, and are read from the
package: no network.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agent_rewind.config import SERVE_FLAGS, Config, build_parser, from_arguments
from agent_rewind.server import check_replicas, check_transport, choose_backend
from agent_rewind.sessions.live import PROCESS_BUDGET_BYTES, SERVICE_RESERVE_BYTES, default_max_live

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RENDERINGS = {
    "base": DEPLOY / "base",
    "replicas": DEPLOY / "overlays" / "replicas",
    "replicas-shared": DEPLOY / "overlays" / "replicas-shared",
    "webhooks": DEPLOY / "overlays" / "webhooks",
}
# The renderings of several replicas on one database (the ones with the database's Secret).
REPLICAS = {"replicas", "replicas-shared"}
# The one whose replicas share a ReadWriteMany volume (--shared-storage) instead of a volume each.
SHARED_STORAGE = "replicas-shared"
# The oldest Kubernetes the manifests claim (deploy/README.md), and a recent one.
KUBERNETES_VERSIONS = ("1.30", "1.33")

APP_LABEL = {"app.kubernetes.io/name": "agent-rewind"}
CONTAINER = "agent-rewind"
# The Secrets deploy/README.md tells how to create, and the keys the manifests read from them.
SECRETS = {
    "agent-rewind-access": {"access.json"},
    "agent-rewind-tls": {"tls.crt", "tls.key"},
    "agent-rewind-anthropic": {"api-key"},
}
OVERLAY_SECRETS = {name: {"agent-rewind-database": {"url", "password"}} for name in REPLICAS}
OVERLAY_SECRETS["webhooks"] = {"agent-rewind-webhooks": {"keys"}}
# Variables an overlay sets for a flag the contract specifies and the server does not read yet.
PENDING_VARIABLES: dict[str, dict[str, str]] = {}
# Never a literal value in a manifest.
SECRET_VARIABLES = {
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "AGENT_REWIND_DATABASE_URL",
}


# --- a kustomize of exactly the features deploy/ uses -------------------------------------------


class KustomizeError(Exception):
    """A kustomization this renderer cannot render exactly as kustomize would, or a broken one."""


KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "patches"}
PATCH_FIELDS = {"path", "patch", "target"}
TARGET_FIELDS = {"kind", "name"}
JSON_PATCH_OPS = {"add", "remove", "replace", "test"}
# The lists a strategic merge patch may hold, by field name, and the key their items merge on (the
# Kubernetes API's patchMergeKey for PodSpec.containers and Container.env). Every other list has
# its own strategy in the API (merge on another key, or replace): refused rather than guessed.
# The patchMergeKey of each list as the Kubernetes API declares it.
MERGE_KEYS = {"containers": "name", "env": "name", "volumeMounts": "mountPath", "volumes": "name"}


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources `kustomize build directory` makes, in the order of `resources` (kustomize
    sorts them by kind on output; nothing here depends on the order)."""
    directory = directory.resolve()
    names = [
        n for n in ("kustomization.yaml", "kustomization.yml", "Kustomization") if (directory / n).is_file()
    ]
    if names != ["kustomization.yaml"]:
        raise KustomizeError(f"{directory}: expected one kustomization.yaml, found {names or 'none'}")
    kustomization = _load_one(directory / "kustomization.yaml")
    unknown = set(kustomization) - KUSTOMIZATION_FIELDS
    if unknown:
        raise KustomizeError(
            f"{directory}: kustomization fields this renderer does not implement: {sorted(unknown)}"
        )
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != (
        "kustomize.config.k8s.io/v1beta1",
        "Kustomization",
    ):
        raise KustomizeError(f"{directory}: not a kustomize.config.k8s.io/v1beta1 Kustomization")

    resources: list[dict[str, Any]] = []
    for entry in _list_of(kustomization, "resources", str, directory):
        if "://" in entry or entry.startswith("git@"):
            raise KustomizeError(f"{directory}: remote resource {entry!r} not supported")
        target = (directory / entry).resolve()
        if target.is_dir():
            resources += render(target)  # a base may be anywhere, as in kustomize
        else:
            resources += _load_resources(_inside(directory, entry))
    seen: set[tuple[str, str, str]] = set()
    for resource in resources:
        if _identity(resource) in seen:
            raise KustomizeError(f"{directory}: {_identity(resource)} is defined twice")
        seen.add(_identity(resource))

    for patch in _list_of(kustomization, "patches", dict, directory):
        unknown = set(patch) - PATCH_FIELDS
        if unknown:
            raise KustomizeError(f"{directory}: patch fields not implemented: {sorted(unknown)}")
        if ("path" in patch) == ("patch" in patch):
            raise KustomizeError(f"{directory}: a patch has either `path` or `patch`")
        text = _inside(directory, patch["path"]).read_text() if "path" in patch else patch["patch"]
        body = yaml.safe_load(text)
        if isinstance(body, list):  # JSON 6902, as kustomize tells them apart
            index = _only_match(resources, _target(patch, directory), directory)
            resources[index] = json_patch(resources[index], body)
        elif isinstance(body, dict):
            if "target" in patch:
                raise KustomizeError(f"{directory}: a strategic merge patch with `target` is not implemented")
            index = _only_match(resources, _identity(body), directory)
            resources[index] = strategic_merge(resources[index], body)
            if _identity(resources[index]) != _identity(body):
                raise KustomizeError(f"{directory}: a patch may not rename what it patches")
        else:
            raise KustomizeError(f"{directory}: a patch is neither a JSON patch nor a resource")
    return resources


def strategic_merge(original: dict[str, Any], patch: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A strategic merge patch: maps merge, null deletes, scalars replace, MERGE_KEYS lists merge
    item by item on their key (new items are appended); no directives."""
    merged = dict(original)
    for key, value in patch.items():
        at = f"{where}.{key}"
        if key.startswith("$"):
            raise KustomizeError(f"{at}: strategic merge directives are not implemented")
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict):
            current = merged.get(key)
            merged[key] = strategic_merge(current if isinstance(current, dict) else {}, value, at)
        elif isinstance(value, list):
            if key not in MERGE_KEYS and key not in merged:
                merged[key] = copy.deepcopy(value)  # nothing to merge with: however the API merges it
                continue
            if key not in MERGE_KEYS:
                raise KustomizeError(f"{at}: this renderer does not know how the API merges this list")
            merged[key] = _merge_list(merged.get(key) or [], value, MERGE_KEYS[key], at)
        else:
            merged[key] = value
    return merged


def _merge_list(original: list[Any], patch: list[Any], key: str, where: str) -> list[Any]:
    merged = list(original)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise KustomizeError(f"{where}: every item needs its merge key {key!r}")
        matches = [i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item[key]]
        if matches:
            merged[matches[0]] = strategic_merge(merged[matches[0]], item, f"{where}[{item[key]}]")
        else:
            merged.append(strategic_merge({}, item, f"{where}[{item[key]}]"))
    return merged


def json_patch(document: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    """RFC 6902 add, remove, replace and test (kustomize also has move and copy: not implemented)."""
    document = copy.deepcopy(document)
    for operation in operations:
        if not isinstance(operation, dict) or operation.get("op") not in JSON_PATCH_OPS:
            raise KustomizeError(f"JSON patch operation not implemented: {operation!r}")
        if set(operation) - {"op", "path", "value"}:
            raise KustomizeError(f"JSON patch fields not implemented: {operation!r}")
        op, path = operation["op"], operation.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise KustomizeError(f"{op}: a JSON pointer below the document is needed, not {path!r}")
        if op in {"add", "replace", "test"} and "value" not in operation:
            raise KustomizeError(f"{op} {path}: no value")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]
        parent: Any = document
        for token in tokens[:-1]:
            parent = _step(parent, token, path)
        last = tokens[-1]
        value = copy.deepcopy(operation.get("value"))
        if op == "test":
            if _step(parent, last, path) != value:
                raise KustomizeError(f"test {path}: the document holds {_step(parent, last, path)!r}")
        elif isinstance(parent, dict):
            if op != "add" and last not in parent:
                raise KustomizeError(f"{op} {path}: nothing there")
            if op == "remove":
                del parent[last]
            else:
                parent[last] = value
        elif isinstance(parent, list):
            if op == "add" and last == "-":
                parent.append(value)
                continue
            index = _index(last, len(parent) + (op == "add"), path)
            if op == "add":
                parent.insert(index, value)
            elif op == "remove":
                del parent[index]
            else:
                parent[index] = value
        else:
            raise KustomizeError(f"{op} {path}: the parent is not a map or a list")
    return document


def _step(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list):
        return node[_index(token, len(node), path)]
    raise KustomizeError(f"{path}: no {token!r} in the document")


def _index(token: str, size: int, path: str) -> int:
    if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) >= size:
        raise KustomizeError(f"{path}: {token!r} is not an index of this list")
    return int(token)


def _identity(resource: dict[str, Any]) -> tuple[str, str, str]:
    return (
        resource.get("apiVersion", ""),
        resource.get("kind", ""),
        resource.get("metadata", {}).get("name", ""),
    )


def _target(patch: dict[str, Any], directory: Path) -> dict[str, str]:
    target = patch.get("target")
    if not isinstance(target, dict) or set(target) != TARGET_FIELDS:
        raise KustomizeError(f"{directory}: a JSON patch needs a target of exactly {sorted(TARGET_FIELDS)}")
    return target


def _only_match(resources: list[dict[str, Any]], wanted: Any, directory: Path) -> int:
    """The one resource a patch applies to (kustomize lets a target select several, or none: a
    patch that selects none here is a mistake, so it is refused)."""
    if isinstance(wanted, tuple):
        matches = [i for i, r in enumerate(resources) if _identity(r) == wanted]
    else:
        matches = [i for i, r in enumerate(resources) if _identity(r)[1:] == (wanted["kind"], wanted["name"])]
    if len(matches) != 1:
        raise KustomizeError(f"{directory}: a patch for {wanted} matches {len(matches)} resources")
    return matches[0]


def _inside(directory: Path, entry: str) -> Path:
    """A file of the kustomization, which kustomize reads only from below its directory."""
    path = (directory / entry).resolve()
    if not path.is_relative_to(directory) or not path.is_file():
        raise KustomizeError(f"{directory}: {entry!r} is not a file below the kustomization")
    return path


def _list_of(kustomization: dict[str, Any], field: str, kind: type, directory: Path) -> list[Any]:
    value = kustomization.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise KustomizeError(f"{directory}: `{field}` is a list of {kind.__name__}")
    return value


def _load_one(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise KustomizeError(f"{path}: not a YAML map")
    return data


def _load_resources(path: Path) -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for document in documents:
        if not isinstance(document, dict) or not all(_identity(document)):
            raise KustomizeError(f"{path}: a resource without apiVersion, kind or metadata.name")
    return documents


# --- what the manifests run: the image (Dockerfile) and the server's configuration ---------------


@dataclass(frozen=True)
class Image:
    uid: int
    serve_flags: list[str]  # what the ENTRYPOINT passes to `agent-rewind serve`
    env: dict[str, str]


@functools.cache
def image() -> Image:
    logical, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append((current + line).strip())
        current = ""
    runtime = logical[next(i for i, line in enumerate(logical) if re.match(r"FROM .* AS runtime$", line)) :]
    args = dict(shlex.split(line)[1].split("=", 1) for line in runtime if line.startswith("ARG "))
    env: dict[str, str] = {}
    for line in runtime:
        if line.startswith("ENV "):
            env.update(item.split("=", 1) for item in shlex.split(line)[1:])
    (entrypoint,) = [
        json.loads(line.removeprefix("ENTRYPOINT ")) for line in runtime if line.startswith("ENTRYPOINT ")
    ]
    (user,) = [line.removeprefix("USER ") for line in runtime if line.startswith("USER ")]
    uid = int(args["UID"])
    assert user == "${UID}:${UID}", user
    assert entrypoint[entrypoint.index("agent-rewind") + 1] == "serve", entrypoint
    return Image(uid=uid, serve_flags=entrypoint[entrypoint.index("serve") + 1 :], env=env)


@functools.cache
def _rendered(name: str) -> str:
    return json.dumps(render(RENDERINGS[name]))


@dataclass
class Rendering:
    name: str
    resources: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.resources if r["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [r for r in self.of_kind(kind) if name is None or r["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    @property
    def workload(self) -> dict[str, Any]:
        workloads = [r for r in self.resources if r["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}]
        assert [w["kind"] for w in workloads] == ["StatefulSet"], workloads
        return workloads[0]

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.workload["spec"]["template"]["spec"]
        return spec

    @property
    def containers(self) -> list[dict[str, Any]]:
        return [*self.pod.get("initContainers", []), *self.pod["containers"]]

    @property
    def container(self) -> dict[str, Any]:
        (container,) = [c for c in self.pod["containers"] if c["name"] == CONTAINER]
        return container

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.container.get("env", [])}

    @property
    def argv(self) -> list[str]:
        """`agent-rewind serve`'s arguments in the pod: the image's, then the container's args."""
        assert "command" not in self.container, "the manifests keep the image's ENTRYPOINT"
        return [*image().serve_flags, *self.container.get("args", [])]

    @property
    def environ(self) -> dict[str, str]:
        """The server's environment: the image's, then the container's (Secrets as placeholders)."""
        values = {n: e.get("value", f"<from {e.get('valueFrom')}>") for n, e in self.env.items()}
        return {**image().env, **values}

    def config(self) -> Config:
        parser = build_parser("agent-rewind serve")
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                ns = parser.parse_args(self.argv)
            except SystemExit:
                pytest.fail(f"`serve` refuses {self.argv}: {stderr.getvalue()}")
        try:
            return from_arguments(ns, self.environ)
        except argparse.ArgumentError as err:
            pytest.fail(f"`serve` refuses the environment: {err}")

    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.container["ports"]}

    def secret_files(self) -> dict[str, tuple[str, str]]:
        """Every file mounted from a Secret: its path in the container -> (Secret, key)."""
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        files = {}
        for mount in self.container.get("volumeMounts", []):
            secret = volumes.get(mount["name"], {}).get("secret")  # else a claim template
            if secret is None:
                continue
            assert "subPath" not in mount, "a subPath mount never sees the Secret change"
            for item in secret["items"]:
                files[_as_served(PurePosixPath(mount["mountPath"], item["path"]))] = (
                    secret["secretName"],
                    item["key"],
                )
        return files


@pytest.fixture(params=sorted(RENDERINGS))
def rendering(request: pytest.FixtureRequest) -> Rendering:
    return Rendering(request.param, json.loads(_rendered(request.param)))


def _as_served(path: PurePosixPath | str) -> str:
    """A path in the container as the server's Config holds it: resolved, on this machine (where
    /etc or /var may be symlinks, as on macOS), which is how Config.resolved() sees it here."""
    return str(Path(path).resolve())


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _quantity(text: str | int) -> float:
    """A Kubernetes quantity (the forms the manifests use: 1, 500m, 1Gi, 256Mi)."""
    match = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti)?", str(text))
    assert match, f"not a quantity this test reads: {text!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return float(match[1]) * scale[match[2]]


# --- the manifests are valid Kubernetes --------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_is_valid_against_the_kubernetes_api_schema(
    rendering: Rendering, version: str
) -> None:
    errors = []
    for resource in rendering.resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            errors.append(f"{resource['kind']}/{resource['metadata']['name']}: {where}: {err.message}")
    assert not errors, f"{rendering.name} is not valid Kubernetes {version}:\n" + "\n".join(errors)
    shared = {"PersistentVolumeClaim"} if rendering.name == SHARED_STORAGE else set()
    assert {r["kind"] for r in rendering.resources} == {
        "ServiceAccount",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        *shared,
    }


def test_resources_name_no_namespace_and_carry_the_app_label(rendering: Rendering) -> None:
    workload = rendering.workload
    for metadata in [
        *(r["metadata"] for r in rendering.resources),
        workload["spec"]["template"]["metadata"],
        *(t["metadata"] for t in workload["spec"].get("volumeClaimTemplates", [])),
    ]:
        assert "namespace" not in metadata, metadata
        assert metadata.get("labels", {}).items() >= APP_LABEL.items(), metadata
    # No Secret is in the repository: deploy/README.md tells how to create them.
    assert not rendering.of_kind("Secret")


def test_every_selector_selects_the_pods(rendering: Rendering) -> None:
    pod_labels = rendering.workload["spec"]["template"]["metadata"]["labels"].items()
    selectors = [
        rendering.workload["spec"]["selector"]["matchLabels"],
        rendering.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        rendering.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        *(s["spec"]["selector"] for s in rendering.of_kind("Service")),
        *(c["labelSelector"]["matchLabels"] for c in rendering.pod.get("topologySpreadConstraints", [])),
    ]
    for selector in selectors:
        assert selector and selector.items() <= pod_labels, selector


# --- the workload -----------------------------------------------------------------------------


def test_the_workload_is_a_statefulset_with_the_state_dir_on_a_claim(rendering: Rendering) -> None:
    spec = rendering.workload["spec"]
    assert spec["replicas"] == {"base": 1, "replicas": 3, "replicas-shared": 3, "webhooks": 1}[rendering.name]
    # One pod at a time, each gone before its successor mounts its ReadWriteOnce volume.
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert "maxUnavailable" not in spec["updateStrategy"].get("rollingUpdate", {})
    assert spec["podManagementPolicy"] == "Parallel"
    # Its governing Service is headless and in the same rendering.
    assert rendering.one("Service", spec["serviceName"])["spec"]["clusterIP"] == "None"
    # The state dir is mounted where the image's ENTRYPOINT and HOME say.
    mounts = {_as_served(m["mountPath"]): m for m in rendering.container["volumeMounts"]}
    state_dir = str(rendering.config().state_dir)
    assert _as_served(image().env["HOME"]) == state_dir
    volumes = {v["name"]: v for v in rendering.pod.get("volumes", [])}
    if rendering.name == SHARED_STORAGE:
        # One ReadWriteMany claim that every pod mounts; no claim per pod, so no retention
        # policy for such claims either.
        assert "volumeClaimTemplates" not in spec
        assert "persistentVolumeClaimRetentionPolicy" not in spec
        claim = volumes[mounts[state_dir]["name"]]["persistentVolumeClaim"]["claimName"]
        assert rendering.one("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
        return
    # Claims per pod (the state, the workspaces), kept when the StatefulSet is deleted or scaled
    # down.
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    templates = {t["metadata"]["name"]: t for t in spec["volumeClaimTemplates"]}
    assert set(templates) == {"state", "workspaces"}
    for name, template in templates.items():
        assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert name not in volumes
    assert mounts[state_dir]["name"] == "state"
    assert not rendering.of_kind("PersistentVolumeClaim")


def _volume_of(rendering: Rendering, path: Path) -> str:
    """The pod volume `path` lies on: the one mounted at the deepest mount path holding it."""
    mounts = {Path(_as_served(m["mountPath"])): m["name"] for m in rendering.container["volumeMounts"]}
    holding = [mount for mount in mounts if path.is_relative_to(mount)]
    assert holding, f"{path} is on no volume: the read-only root"
    return mounts[max(holding, key=lambda mount: len(mount.parts))]


def test_the_workspaces_have_a_volume_of_their_own(rendering: Rendering) -> None:
    """An agent filling its workspace fills that volume, never the state dir's: every workspace
    root lies on a claim other than the state dir's (docs/operations.md, "A full disk")."""
    config = rendering.config()
    spec = rendering.workload["spec"]
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    claims |= {v["name"] for v in rendering.pod.get("volumes", []) if "persistentVolumeClaim" in v}
    state = _volume_of(rendering, config.state_dir)
    assert config.workspace_roots
    for root in config.workspace_roots:
        assert not root.is_relative_to(config.state_dir), root
        volume = _volume_of(rendering, root)
        assert volume in claims and volume != state, (root, volume)


def test_every_container_has_resources_and_a_locked_down_security_context(rendering: Rendering) -> None:
    pod = rendering.pod
    pod_security = pod["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    account = rendering.one("ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False, (
        "the agent-rewind Service would inject AGENT_REWIND_PORT and more"
    )
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in rendering.workload["spec"].get("volumeClaimTemplates", [])}
    claims |= {name for name, volume in volumes.items() if "persistentVolumeClaim" in volume}
    assert rendering.containers
    for container in rendering.containers:
        security = {**pod_security, **container.get("securityContext", {})}
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == image().uid
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security.get("privileged") is not True
        assert security["capabilities"] == {"drop": ["ALL"]}
        # The command sandbox's user namespaces: the profile shipped in deploy/seccomp/.
        assert security["seccompProfile"] == {"type": "Localhost", "localhostProfile": "agent-rewind.json"}
        # ... and the /proc of its own it mounts: only an unmasked /proc lets it, and the API
        # allows that only in a pod with a user namespace of its own (the image test runs both).
        assert security["procMount"] == "Unmasked"
        assert pod["hostUsers"] is False
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]
        assert _quantity(resources["requests"]["memory"]) <= _quantity(resources["limits"]["memory"])
        # With a read-only root, these are all it can write: its claim and an emptyDir /tmp.
        writable = {
            m["mountPath"]: m["name"] for m in container.get("volumeMounts", []) if not m.get("readOnly")
        }
        for path, name in writable.items():
            assert name in claims or "emptyDir" in volumes[name], (path, name)
        assert "emptyDir" in volumes[writable["/tmp"]]


def test_memory_is_sized_from_max_live_sessions(rendering: Rendering) -> None:
    live = rendering.config().max_live_sessions
    limit = _quantity(rendering.container["resources"]["limits"]["memory"])
    # 512 MiB for the service, 320 MiB for each live Claude Code process: 512Mi + 14 x 320Mi.
    assert live == 14
    assert limit == SERVICE_RESERVE_BYTES + live * PROCESS_BUDGET_BYTES
    assert default_max_live(int(limit)) == live, "what the service would work out from the limit itself"


def test_termination_grace_exceeds_the_shutdown_grace(rendering: Rendering) -> None:
    grace = rendering.config().shutdown_grace
    assert grace > 0
    # The grace for turns, 1 s to stop the gRPC server, then every CLI process to close.
    assert rendering.pod["terminationGracePeriodSeconds"] >= grace + 10


# --- the server it runs -----------------------------------------------------------------------


def test_the_flags_and_variables_are_real_serve_flags(rendering: Rendering) -> None:
    by_variable = {flag.env_var: flag for flag in SERVE_FLAGS}
    pending = PENDING_VARIABLES.get(rendering.name, {})
    argv = rendering.argv
    assert rendering.env
    for name, entry in rendering.env.items():
        if name in SECRET_VARIABLES:
            assert "secretKeyRef" in entry.get("valueFrom", {}), f"{name} must come from a Secret"
        if not name.startswith("AGENT_REWIND_") or name in pending:
            continue
        assert name in by_variable, f"{name} is not the variable of any `serve` flag"
        flag = by_variable[name]
        given = [a for a in argv if a.split("=", 1)[0] in {flag.name, "--no-" + flag.name.removeprefix("--")}]
        assert not given, f"{name} is dead: the command line already says {given}"
        if "value" in entry:
            assert flag.from_environment({name: entry["value"]}) is not None, f"{name} is empty"
    for name in set(image().env) - set(rendering.env):
        if name.startswith("AGENT_REWIND_"):
            assert name in by_variable, f"the image sets {name}, no flag's variable"
    rendering.config()  # the whole command line and environment, as `serve` reads them


def test_the_server_starts_secured_with_the_files_from_the_secrets(rendering: Rendering) -> None:
    config = rendering.config()
    # Beyond loopback only with authentication and TLS: the server checks this at start.
    assert config.listen.rsplit(":", 1)[0] not in {"127.0.0.1", "localhost", "[::1]"}
    assert not config.insecure
    check_transport(config)
    files = rendering.secret_files()
    assert files[str(config.access_file)] == ("agent-rewind-access", "access.json")
    assert files[str(config.tls_cert)] == ("agent-rewind-tls", "tls.crt")
    assert files[str(config.tls_key)] == ("agent-rewind-tls", "tls.key")
    # The real model, with its credential.
    assert choose_backend(config, rendering.environ) == "anthropic"


def test_the_probes_use_the_plaintext_health_port(rendering: Rendering) -> None:
    config = rendering.config()
    ports = rendering.ports()
    assert config.health_listen, "the kubelet's gRPC probes cannot speak TLS: --health-listen is needed"
    health = _port(config.health_listen)
    assert ports["health"] == health
    assert health != _port(config.listen), "the main port is TLS"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = rendering.container[probe]["grpc"]["port"]
        assert port == health and port in ports.values(), (probe, port)


def test_prometheus_scrapes_the_metrics_port(rendering: Rendering) -> None:
    config = rendering.config()
    annotations = rendering.workload["spec"]["template"]["metadata"]["annotations"]
    assert config.metrics_listen
    assert rendering.ports()["metrics"] == _port(config.metrics_listen)
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(_port(config.metrics_listen)),
        "prometheus.io/path": "/metrics",
    }


def test_the_services_reach_the_ports_the_server_listens_on(rendering: Rendering) -> None:
    config = rendering.config()
    ports = rendering.ports()
    for service in rendering.of_kind("Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, port
            assert port["port"] == ports[port["targetPort"]], port
    service = rendering.one("Service", "agent-rewind")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": _port(config.listen),
        "metrics": _port(config.metrics_listen),
    }


def test_the_network_policy_admits_the_served_ports_only(rendering: Rendering) -> None:
    config = rendering.config()
    policy = rendering.one("NetworkPolicy")["spec"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    ingress = {(p["port"], p["protocol"]) for rule in policy["ingress"] for p in rule["ports"]}
    served = {_port(a) for a in (config.listen, config.metrics_listen, config.health_listen)}
    assert ingress == {(port, "TCP") for port in served}
    assert served == set(rendering.ports().values())
    assert all("ports" in rule for rule in policy["ingress"]), "a rule without ports admits every port"

    egress = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
    expected = {(53, "UDP"), (53, "TCP"), (443, "TCP")}
    if rendering.name in REPLICAS:
        expected |= {(_port(config.listen), "TCP"), (5432, "TCP")}
    assert egress == expected
    assert all("ports" in rule for rule in policy["egress"]), "a rule without ports lets out every port"
    (https,) = [rule for rule in policy["egress"] if rule["ports"] == [{"port": 443, "protocol": "TCP"}]]
    blocks = {b["ipBlock"]["cidr"]: set(b["ipBlock"].get("except", [])) for b in https["to"]}
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= blocks["0.0.0.0/0"]


def test_the_secrets_are_the_documented_ones(rendering: Rendering) -> None:
    used: dict[str, set[str]] = {}
    for secret, key in rendering.secret_files().values():
        used.setdefault(secret, set()).add(key)
    for entry in rendering.env.values():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert not ref.get("optional"), ref
            used.setdefault(ref["name"], set()).add(ref["key"])
    for volume in rendering.pod.get("volumes", []):
        assert not volume.get("secret", {}).get("optional"), volume
    assert used == {**SECRETS, **OVERLAY_SECRETS.get(rendering.name, {})}

    readmes = [DEPLOY / "README.md", RENDERINGS[rendering.name] / "README.md"]
    documented = "".join(path.read_text() for path in readmes if path.exists())
    for secret, keys in used.items():
        commands = [c for c in _commands(documented) if re.match(rf"kubectl create secret \w+ {secret}\b", c)]
        assert commands, f"{[str(p.relative_to(ROOT)) for p in readmes]} should say how to create {secret}"
        for command in commands:
            if command.startswith("kubectl create secret tls "):
                assert keys == {"tls.crt", "tls.key"} and "--cert=" in command and "--key=" in command
            else:
                for key in keys:
                    assert re.search(rf"--from-(file|literal)={re.escape(key)}=", command), (command, key)


def _commands(markdown: str) -> list[str]:
    """The shell commands of a document's ```sh blocks, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL)
    return [" ".join(c.split()) for block in blocks for c in block.replace("\\\n", " ").splitlines()]


def test_the_replicas_overlay_runs_replicas_on_one_database_each_reachable_by_the_others() -> None:
    """Several replicas share the database from a Secret; each advertises where the others
    forward calls to it."""
    env = Rendering("replicas", json.loads(_rendered("replicas"))).env
    assert "secretKeyRef" in env["AGENT_REWIND_DATABASE_URL"]["valueFrom"]
    assert "AGENT_REWIND_DATABASE_URL" not in Rendering("base", json.loads(_rendered("base"))).env
    # The password as a file from the Secret, never in the environment.
    rendering = Rendering("replicas", json.loads(_rendered("replicas")))
    password = Path(env["AGENT_REWIND_DATABASE_PASSWORD_FILE"]["value"])
    (container,) = rendering.containers
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts[str(password.parent)]
    assert mount["readOnly"] is True
    volume = next(v for v in rendering.pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "agent-rewind-database"
    assert volume["secret"]["items"] == [{"key": "password", "path": password.name}]
    assert not any("password" in str(v.get("valueFrom", "")) for v in env.values())
    # Each replica advertises the name the headless Service gives its pod, on the gRPC port.
    services = Rendering("replicas", json.loads(_rendered("replicas"))).of_kind("Service")
    (headless,) = [d for d in services if d["spec"].get("clusterIP") == "None"]
    advertised = env["AGENT_REWIND_ADVERTISE_ADDRESS"]["value"]
    assert advertised == f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc:50051"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_shared_overlay_runs_every_replica_on_one_volume_with_shared_storage() -> None:
    """--shared-storage on, which the server accepts only with --database-url, and the same claim
    at the same state dir in every pod."""
    shared = Rendering(SHARED_STORAGE, json.loads(_rendered(SHARED_STORAGE)))
    by_variable = {flag.env_var: flag for flag in SERVE_FLAGS}
    flag = by_variable["AGENT_REWIND_SHARED_STORAGE"]
    assert flag.name == "--shared-storage"
    assert flag.from_environment({flag.env_var: shared.env[flag.env_var]["value"]}) is True
    config = shared.config()
    assert config.shared_storage is True
    assert config.database_url, "the server refuses --shared-storage without --database-url"
    check_replicas(config)  # what `serve` checks at start
    assert not Rendering("replicas", json.loads(_rendered("replicas"))).config().shared_storage
    # Every pod is the template's: the same claims at the state dir and at the workspace root,
    # so every replica sees every session's files at the same paths.
    assert "volumeClaimTemplates" not in shared.workload["spec"]
    assert shared.workload["spec"]["replicas"] > 1
    volumes = {v["name"]: v for v in shared.pod["volumes"]}
    for path in (config.state_dir, *config.workspace_roots):
        volume = volumes[_volume_of(shared, path)]
        claim = shared.one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert _quantity(claim["spec"]["resources"]["requests"]["storage"]) > 0
        assert not volume["persistentVolumeClaim"].get("readOnly")


def test_the_readme_describes_every_file_of_deploy() -> None:
    readme = (DEPLOY / "README.md").read_text()
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert files
    for path in files:
        assert str(path.relative_to(DEPLOY)) in readme, f"deploy/README.md does not mention {path}"
    assert "kubectl apply -k deploy/base" in readme


# --- the renderer itself ----------------------------------------------------------------------


def _kustomization(directory: Path, text: str, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + text
    )
    for name, content in files.items():
        (directory / name).write_text(content)
    return directory


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {a: "1"}}
spec:
  replicas: 1
  template:
    spec:
      containers:
        - name: web
          image: web:1
          args: ["--x"]
          env: [{name: A, value: "1"}, {name: B, value: "2"}]
        - {name: side, image: side:1}
"""


def test_the_renderer_applies_patches_as_kustomize_does(tmp_path: Path) -> None:
    _kustomization(tmp_path / "base", "resources: [web.yaml]\n", **{"web.yaml": DEPLOYMENT})
    overlay = _kustomization(
        tmp_path / "overlay",
        "resources: [../base]\npatches:\n  - path: smp.yaml\n"
        "  - target: {kind: Deployment, name: web}\n    patch: |\n"
        "      - {op: test, path: /spec/template/spec/containers/0/name, value: web}\n"
        "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --y}\n"
        "      - {op: add, path: /metadata/labels/b~1c, value: '2'}\n"
        "      - {op: remove, path: /spec/template/spec/containers/1}\n",
        **{
            "smp.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 3\n"
            "  template:\n    spec:\n      containers:\n        - name: web\n          image: null\n"
            "          env: [{name: B, value: '9'}, {name: C, value: '3'}]\n"
        },
    )
    (web,) = render(overlay)
    assert web["spec"]["replicas"] == 3
    assert web["metadata"]["labels"] == {"a": "1", "b/c": "2"}
    assert web["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "web",
            "args": ["--x", "--y"],
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "9"}, {"name": "C", "value": "3"}],
        }
    ]


@pytest.mark.parametrize(
    ("kustomization", "files"),
    [
        ("namespace: prod\nresources: [web.yaml]\n", {}),
        ("commonLabels: {a: b}\nresources: [web.yaml]\n", {}),
        ("labels: [{pairs: {a: b}}]\nresources: [web.yaml]\n", {}),
        ("images: [{name: web, newTag: '2'}]\nresources: [web.yaml]\n", {}),
        ("resources: [web.yaml]\nconfigMapGenerator: [{name: c, literals: [a=b]}]\n", {}),
        ("resources: [web.yaml]\npatchesStrategicMerge: [p.yaml]\n", {}),
        ("resource: [web.yaml]\n", {}),  # a typo is refused, not ignored
        ("resources: [https://example.com/web.yaml]\n", {}),
        ("resources: [../web.yaml]\n", {}),
        ("resources: [web.yaml, web.yaml]\n", {}),
        (
            "resources: [web.yaml]\npatches: [{path: p.yaml, options: {allowNameChange: true}}]\n",
            {"p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"},
        ),
        (  # a strategic merge directive
            "resources: [web.yaml]\npatches: [{path: p.yaml}]\n",
            {"p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n$patch: delete\n"},
        ),
        (  # a list whose merge strategy the renderer does not know, over one the base has
            "resources: [web.yaml]\npatches: [{path: p.yaml}]\n",
            {
                "p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n"
                "    spec:\n      containers: [{name: web, args: [--z]}]\n"
            },
        ),
        (  # a patch for nothing
            "resources: [web.yaml]\npatches: [{path: p.yaml}]\n",
            {"p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: other}\n"},
        ),
        (
            "resources: [web.yaml]\npatches: [{target: {kind: Deployment, labelSelector: a=1}, patch: '[]'}]\n",
            {},
        ),
        (
            "resources: [web.yaml]\npatches: [{target: {kind: Deployment, name: web}, patch: "
            "'[{op: move, from: /spec, path: /x}]'}]\n",
            {},
        ),
        (  # a failing JSON patch test
            "resources: [web.yaml]\npatches: [{target: {kind: Deployment, name: web}, patch: "
            "'[{op: test, path: /spec/replicas, value: 2}]'}]\n",
            {},
        ),
    ],
)
def test_the_renderer_refuses_what_it_does_not_implement(
    tmp_path: Path, kustomization: str, files: dict[str, str]
) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT)
    directory = _kustomization(tmp_path / "k", kustomization, **{"web.yaml": DEPLOYMENT, **files})
    with pytest.raises(KustomizeError):
        render(directory)


# --- the locked dependency sets ------------------------------------------------------------------


def _locked(name: str) -> dict[str, str]:
    """Package -> version of a lock file (requirements/NAME.txt), each line checked to carry hashes."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        first = block.split("\n", 1)[0]
        if first.startswith("#") or not first.strip():
            continue
        package, _, version = first.split(" ", 1)[0].partition("==")
        assert version, f"{name}.txt: {first!r} is not pinned"
        assert "--hash=sha256:" in block, f"{name}.txt: {package} carries no hash"
        pins[package.lower().replace("_", "-")] = version
    return pins


@pytest.mark.parametrize(("lock", "extras"), [("runtime", ("postgres",)), ("dev", ("postgres", "dev"))])
def test_a_lock_pins_every_dependency_within_its_range(lock: str, extras: tuple[str, ...]) -> None:
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"]) + [d for e in extras for d in project["optional-dependencies"][e]]
    pins = _locked(lock)
    assert wanted and pins
    for text in wanted:
        requirement = Requirement(text)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"requirements/{lock}.txt lacks {name}: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements/{lock}.txt pins {name}=={pins[name]}, outside {requirement.specifier}: run `make lock`"
        )


def test_the_image_and_make_install_the_locked_set_with_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY requirements/runtime.txt" in dockerfile
    assert "pip install --require-hashes -r requirements.txt" in dockerfile
    assert "!requirements/runtime.txt" in (ROOT / ".dockerignore").read_text()
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert '--require-hashes -r "requirements/$kind.txt"' in install
    assert _locked("runtime").items() <= _locked("dev").items(), "the dev set holds the runtime set as locked"
