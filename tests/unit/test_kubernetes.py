"""deploy/kubernetes: every manifest validates against the Kubernetes OpenAPI schemas, the
PrometheusRule is the committed rule files, the configs the pods run pass ``ibmon check-config``,
the shard each StatefulSet pod renders is its own, and the probes answer on the daemon the
ConfigMap configures.

Built-in kinds are checked with kubernetes-validate (the OpenAPI schemas of every Kubernetes
release it ships, strict: unknown fields fail). No PyPI package ships prometheus-operator's CRD
schemas in a form that matches the wire format, so ServiceMonitor and PrometheusRule are checked
against the minimal schemas below: closed objects (a misspelt field fails) with the fields and
patterns of the monitoring.coreos.com/v1 API reference, and Kubernetes' own ObjectMeta and
LabelSelector definitions from kubernetes-validate. promtool checks the rule groups themselves.
"""

from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from tests.promql_sources import ALERT_RULES, RECORDING_RULES, REPO
from tests.sysfs_tree import write_device, write_port
from tests.syspkg import require_binary

K8S = REPO / "deploy" / "kubernetes"
BASE = K8S / "base"
PRIVILEGED = K8S / "privileged-fabric"
Doc = dict[str, Any]

KUBERNETES_VERSIONS = kubernetes_validate.utils.all_versions()
BUILTIN_GROUPS = ("v1", "apps/v1")


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


@cache
def manifests() -> tuple[tuple[str, Doc], ...]:
    """(file name, object) for every object in base/, in kustomization order."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    return tuple(
        (name, doc) for name in kustomization["resources"] for doc in load_docs(BASE / name)
    )


def find(kind: str, name: str | None = None) -> Doc:
    found = [d for _, d in manifests() if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return copy.deepcopy(found[0])


def workloads() -> list[Doc]:
    return [find("DaemonSet"), find("StatefulSet")]


def pod_containers(workload: Doc) -> Iterator[Doc]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def main_container(workload: Doc) -> Doc:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def by_name(items: list[Doc]) -> dict[str, Doc]:
    return {item["name"]: item for item in items}


def config_of(component: str) -> str:
    return str(find("ConfigMap", f"ibmon-{component}")["data"]["ibmon.toml"])


def ids(item: tuple[str, Doc]) -> str:
    name, doc = item
    return f"{name}:{doc['kind']}/{doc['metadata']['name']}"


# --- schemas --------------------------------------------------------------------------------

BUILTIN = [m for m in manifests() if m[1]["apiVersion"] in BUILTIN_GROUPS]
CUSTOM = [m for m in manifests() if m[1]["apiVersion"] not in BUILTIN_GROUPS]


def test_the_manifests_are_the_expected_set() -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for _, d in manifests())
    assert kinds == [
        "ConfigMap/ibmon-fabric", "ConfigMap/ibmon-node", "DaemonSet/ibmon-node",
        "Namespace/ibmon", "PrometheusRule/ibmon-alerts", "PrometheusRule/ibmon-recording",
        "Service/ibmon-fabric", "Service/ibmon-node", "ServiceAccount/ibmon",
        "ServiceMonitor/ibmon", "StatefulSet/ibmon-fabric",
    ]
    assert {m[1]["kind"] for m in CUSTOM} == {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", BUILTIN, ids=ids)
def test_manifest_validates_against_the_kubernetes_openapi_schema(
    item: tuple[str, Doc], version: str
) -> None:
    kubernetes_validate.validate(item[1], version, strict=True)


def test_the_validator_rejects_a_misspelt_or_mistyped_field() -> None:
    """The check above can fail: strict schemas close every object."""
    ds = find("DaemonSet")
    ctx = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    ctx["readOnlyRootFileSystem"] = ctx.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(ds, KUBERNETES_VERSIONS[-1], strict=True)
    sts = find("StatefulSet")
    sts["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBERNETES_VERSIONS[-1], strict=True)


DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
               r"(([0-9]+)ms)?)$",
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
K8S_DEFS = "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."
SECRET_KEY = {
    "type": "object", "additionalProperties": False, "required": ["key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                   "optional": {"type": "boolean"}},
}
SAFE_TLS = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "ca": {"type": "object"}, "cert": {"type": "object"}, "keySecret": SECRET_KEY,
        "serverName": {"type": "string"}, "insecureSkipVerify": {"type": "boolean"},
        "caFile": {"type": "string"}, "certFile": {"type": "string"},
        "keyFile": {"type": "string"}, "minVersion": {"type": "string"},
        "maxVersion": {"type": "string"},
    },
}
RELABEL = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod",
                            "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop",
                            "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase",
                            "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
        "sourceLabels": {"type": "array",
                         "items": {"type": "string",
                                   "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": {"type": "string"}, "targetLabel": {"type": "string"},
        "regex": {"type": "string"}, "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
    },
}
#: monitoring.coreos.com/v1 ServiceMonitor, the fields of the API reference (prometheus-operator
#: 0.7x-0.8x) that a ServiceMonitor for ibmon can use; anything else fails.
SERVICE_MONITOR = {
    "$id": "https://kubernetes.io/api/monitoring.coreos.com/v1/servicemonitor",
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": K8S_DEFS + "ObjectMeta"},
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": {"$ref": K8S_DEFS + "LabelSelector"},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "sampleLimit": {"type": "integer", "minimum": 0},
                "targetLimit": {"type": "integer", "minimum": 0},
                "scrapeClass": {"type": "string", "minLength": 1},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "params": {"type": "object"},
                            "interval": DURATION, "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "tlsConfig": SAFE_TLS,
                            "basicAuth": {
                                "type": "object", "additionalProperties": False,
                                "properties": {"username": SECRET_KEY, "password": SECRET_KEY},
                            },
                            "authorization": {"type": "object"},
                            "relabelings": {"type": "array", "items": RELABEL},
                            "metricRelabelings": {"type": "array", "items": RELABEL},
                            "followRedirects": {"type": "boolean"},
                            "enableHttp2": {"type": "boolean"},
                            "filterRunning": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}
#: monitoring.coreos.com/v1 PrometheusRule (API reference, RuleGroup and Rule).
PROMETHEUS_RULE = {
    "$id": "https://kubernetes.io/api/monitoring.coreos.com/v1/prometheusrule",
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"$ref": K8S_DEFS + "ObjectMeta"},
        "spec": {
            "type": "object", "additionalProperties": False,
            "properties": {"groups": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": DURATION, "query_offset": DURATION,
                    "limit": {"type": "integer"}, "labels": STRING_MAP,
                    "partial_response_strategy": {"type": "string"},
                    "rules": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False, "required": ["expr"],
                        "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                        "properties": {
                            "record": {"type": "string"}, "alert": {"type": "string"},
                            "expr": {"type": ["integer", "string"]},
                            "for": DURATION, "keep_firing_for": DURATION,
                            "labels": STRING_MAP, "annotations": STRING_MAP,
                        },
                    }},
                },
            }}},
        },
    },
}
CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


@cache
def k8s_registry() -> referencing.Registry[Any]:
    """Kubernetes' own definitions (ObjectMeta, LabelSelector), strict, from the newest release."""
    version = KUBERNETES_VERSIONS[-1]
    path = (importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
            / f"v{version}-local-strict" / "_definitions.json")
    defs = referencing.Resource.from_contents(json.loads(path.read_text(encoding="utf-8")))
    return defs @ referencing.Registry()


def validate_custom(doc: Doc) -> None:
    schema = CRD_SCHEMAS[doc["kind"]]
    jsonschema.Draft202012Validator(schema, registry=k8s_registry()).validate(doc)


@pytest.mark.parametrize("item", CUSTOM, ids=ids)
def test_custom_resource_matches_its_crd_fields(item: tuple[str, Doc]) -> None:
    validate_custom(item[1])


def test_the_crd_check_rejects_a_misspelt_field() -> None:
    monitor = find("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="scrapeTimout"):
        validate_custom(monitor)
    rule = find("PrometheusRule", "ibmon-alerts")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(rule)


# --- PrometheusRule: one source of truth ----------------------------------------------------


def load_build() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_build", K8S / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_prometheusrule_is_what_the_generator_writes() -> None:
    proc = subprocess.run([sys.executable, str(K8S / "build.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_prometheusrule_groups_equal_the_rule_files() -> None:
    """What Prometheus loads from the CR is exactly what promtool tests in deploy/prometheus."""
    for name, path in ((("ibmon-recording", RECORDING_RULES), ("ibmon-alerts", ALERT_RULES))):
        rule = find("PrometheusRule", name)
        assert rule["spec"]["groups"] == yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]


def test_the_generator_check_fails_on_a_stale_copy(tmp_path: Path) -> None:
    build = load_build()
    build.OUT = tmp_path / "prometheusrule.yaml"
    build.OUT.write_text(build.render().replace("ibmon_port_", "ibmon_old_", 1))
    assert build.main(["--check"]) == 1
    assert build.main([]) == 0
    assert build.main(["--check"]) == 0


@pytest.mark.system
@pytest.mark.parametrize("name", ["ibmon-recording", "ibmon-alerts"])
def test_prometheusrule_groups_pass_promtool(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(find("PrometheusRule", name)["spec"]))
    proc = subprocess.run([require_binary("promtool"), "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- kustomize layout -----------------------------------------------------------------------


def test_base_kustomization_lists_every_manifest_and_the_top_level_applies_it() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    files = sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed["resources"]) == files
    assert listed["namespace"] == "ibmon"
    assert all(d["metadata"].get("namespace") == "ibmon"
               for _, d in manifests() if d["kind"] != "Namespace")
    top = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert top["resources"] == ["base"]
    variant = yaml.safe_load((PRIVILEGED / "kustomization.yaml").read_text(encoding="utf-8"))
    assert variant["resources"] == ["../base"]
    assert [p["path"] for p in variant["patches"]] == ["patch.yaml"]


def strategic_merge(base: Any, patch: Any) -> Any:
    """The subset of kubectl's strategic merge the patch uses: maps merge, ``null`` deletes,
    lists of named items (containers, volumes, volumeMounts) merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(base.get(key), value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all("name" in x for x in patch):
        merged = {item["name"]: item for item in base}
        for item in patch:
            merged[item["name"]] = strategic_merge(merged.get(item["name"], {}), item)
        return list(merged.values())
    return patch


def privileged_statefulset() -> Doc:
    (patch,) = load_docs(PRIVILEGED / "patch.yaml")
    assert (patch["kind"], patch["metadata"]["name"]) == ("StatefulSet", "ibmon-fabric")
    merged: Doc = strategic_merge(find("StatefulSet"), patch)
    return merged


@pytest.mark.parametrize("version", [KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]])
def test_privileged_variant_validates_and_uses_the_host_devices(version: str) -> None:
    sts = privileged_statefulset()
    kubernetes_validate.validate(sts, version, strict=True)
    container = main_container(sts)
    assert container["securityContext"]["privileged"] is True
    # Kubernetes rejects privileged together with allowPrivilegeEscalation=false.
    assert "allowPrivilegeEscalation" not in container["securityContext"]
    assert not any(r.startswith("rdma/") for r in container["resources"]["limits"])
    mounts = by_name(container["volumeMounts"])
    volumes = by_name(sts["spec"]["template"]["spec"]["volumes"])
    assert mounts["dev-infiniband"]["mountPath"] == "/dev/infiniband"
    assert volumes["dev-infiniband"]["hostPath"]["path"] == "/dev/infiniband"


# --- least privilege ------------------------------------------------------------------------


def test_every_container_is_locked_down() -> None:
    for workload in workloads():
        spec = workload["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod_containers(workload):
            ctx = container["securityContext"]
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            assert ctx.get("privileged") is not True, where
            added = ctx["capabilities"].get("add", [])
            assert added == (["CHOWN"] if container["name"] == "state-dir" else []), where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where


def test_node_daemon_runs_unprivileged_with_sys_read_only() -> None:
    ds = find("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert "hostNetwork" not in spec and "hostPID" not in spec
    volumes = by_name(spec["volumes"])
    mounts = by_name(main_container(ds)["volumeMounts"])
    assert volumes["sys"]["hostPath"]["path"] == "/sys"
    assert mounts["sys"]["readOnly"] is True
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/sys", "/var/lib/ibmon/node"}
    # The sysfs source reads the mounted tree, not the container's own /sys.
    (source,) = tomllib.loads(config_of("node"))["sources"]
    assert source["type"] == "sysfs" and source["root"] == mounts["sys"]["mountPath"]


def test_fabric_pods_get_umad_from_the_device_plugin_on_management_nodes_only() -> None:
    sts = find("StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    container = main_container(sts)
    assert any(r.startswith("rdma/") for r in container["resources"]["limits"])
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/var/lib/ibmon/fabric"}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "ibmon.io/fabric-manager", "operator": "In", "values": ["true"]}]


# --- the configs the pods run ---------------------------------------------------------------


def ibmon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ibmon", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def uncomment_options(text: str) -> str:
    """The config with every option shown commented out switched on (secret files included)."""
    return "".join(
        re.sub(r"^# (\[mqtt(\.tls)?\]|\w+ = )", r"\1", line)
        for line in text.splitlines(keepends=True)
    )


def mount_secrets(root: Path) -> Path:
    """What the pods' Secret volumes hold, as files under ``root`` (throwaway TLS material)."""
    from tests.mqtt_broker import make_tls
    from tests.syspkg import require_binary

    require_binary("openssl")
    tls = make_tls(root / "tls")
    for name, data in {
        "web-tls/tls.crt": tls.server_cert.read_bytes(),
        "web-tls/tls.key": tls.server_key.read_bytes(),
        "web-auth/basic-auth": b"prometheus:" + b"0" * 64 + b"\n",
        "mqtt/password": b"secret\n",
        "mqtt/ca.crt": tls.ca.read_bytes(),
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def secret_paths(text: str) -> set[str]:
    return set(re.findall(r'"(/run/secrets/ibmon/[^"]+)"', text))


@pytest.mark.parametrize("component", ["node", "fabric"])
@pytest.mark.parametrize("secrets", [False, True], ids=["default", "with-secrets"])
def test_configmap_config_passes_check_config(
    component: str, secrets: bool, tmp_path: Path
) -> None:
    text = config_of(component).replace("@ORDINAL@", "0").replace("@SHARDS@", "2")
    if secrets:
        text = uncomment_options(text)
        settings = tomllib.loads(text)
        assert settings["mqtt"]["password_file"].startswith("/run/secrets/ibmon/")
        assert settings["prometheus"]["basic_auth_file"].startswith("/run/secrets/ibmon/")
        # check-config reads every file the config names, as run does: give it the Secrets.
        text = text.replace("/run/secrets/ibmon/", f"{mount_secrets(tmp_path / 'secrets')}/")
    path = tmp_path / "ibmon.toml"
    path.write_text(text)
    proc = ibmon("check-config", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "listen 0.0.0.0:9683" in proc.stdout


@pytest.mark.parametrize("workload", ["DaemonSet", "StatefulSet"])
def test_every_secret_file_the_config_names_is_a_mounted_secret_key(workload: str) -> None:
    doc = find(workload)
    component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
    paths = secret_paths(config_of(component))
    assert {p.rsplit("/", 1)[1] for p in paths} >= {"password", "ca.crt", "tls.crt", "tls.key",
                                                    "basic-auth"}
    volumes = by_name(doc["spec"]["template"]["spec"]["volumes"])
    mounted: set[str] = set()
    for mount in main_container(doc)["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret:
            assert secret["optional"] is True and mount["readOnly"] is True
            mounted |= {f"{mount['mountPath']}/{item['path']}" for item in secret["items"]}
    assert paths <= mounted, paths - mounted


def test_config_is_mounted_where_the_command_reads_it() -> None:
    ds = find("DaemonSet")
    container = main_container(ds)
    assert container["command"] == ["ibmon", "run", "--config", "/etc/ibmon/ibmon.toml"]
    mounts = by_name(container["volumeMounts"])
    volumes = by_name(ds["spec"]["template"]["spec"]["volumes"])
    assert mounts["config"]["mountPath"] == "/etc/ibmon"
    assert volumes["config"]["configMap"]["name"] == "ibmon-node"
    state = tomllib.loads(config_of("node"))["state"]["path"]
    assert state.startswith(mounts["state"]["mountPath"] + "/")
    assert volumes["state"]["hostPath"]["path"] == mounts["state"]["mountPath"]


# --- shards from pod names ------------------------------------------------------------------


def render_container() -> Doc:
    sts = find("StatefulSet")
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "render-config"
    return dict(init)


def run_render(pod_name: str, tmp_path: Path, shard_count: str | None = None
               ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the init container's own script, with its files moved under tmp_path."""
    init = render_container()
    shell, flags, script = init["command"]
    env_in = {e["name"]: e.get("value") for e in init["env"]}
    template = tmp_path / "template.toml"
    template.write_text(config_of("fabric"))
    out = tmp_path / f"{pod_name}.toml"
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "POD_NAME": pod_name,
        "SHARD_COUNT": shard_count if shard_count is not None else str(env_in["SHARD_COUNT"]),
        "CONFIG_TEMPLATE": str(template),
        "CONFIG_OUT": str(out),
    }
    proc = subprocess.run([shell, flags, script], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    return proc, out


def test_render_config_paths_are_the_mounted_ones() -> None:
    sts = find("StatefulSet")
    init = render_container()
    env = {e["name"]: e for e in init["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SHARD_COUNT"]["value"] == str(sts["spec"]["replicas"])
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    main = main_container(sts)
    main_mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    template_dir, _ = env["CONFIG_TEMPLATE"]["value"].rsplit("/", 1)
    out_dir, out_name = env["CONFIG_OUT"]["value"].rsplit("/", 1)
    volumes = by_name(sts["spec"]["template"]["spec"]["volumes"])
    assert volumes[init_mounts[template_dir]]["configMap"]["name"] == "ibmon-fabric"
    assert "emptyDir" in volumes[init_mounts[out_dir]]
    assert main_mounts[out_dir] == init_mounts[out_dir]
    assert main["command"] == ["ibmon", "run", "--config", env["CONFIG_OUT"]["value"]]
    assert out_name == "ibmon.toml"


def test_each_statefulset_pod_renders_its_own_valid_shard(tmp_path: Path) -> None:
    replicas = find("StatefulSet")["spec"]["replicas"]
    state_paths = set()
    for ordinal in range(replicas):
        proc, out = run_render(f"ibmon-fabric-{ordinal}", tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert ": OK" in proc.stdout  # ibmon check-config on the rendered file
        config = tomllib.loads(out.read_text())
        (source,) = config["sources"]
        assert source["shard"] == f"{ordinal}/{replicas}"
        state_paths.add(config["state"]["path"])
        assert "@" not in out.read_text()
    assert len(state_paths) == replicas  # shards never share a state file


@pytest.mark.parametrize(
    ("pod", "count", "needle"),
    [
        ("ibmon-fabric-2", None, "SHARD_COUNT is 2"),  # scaled up without SHARD_COUNT
        ("ibmon-fabric", None, "no StatefulSet ordinal"),
        ("ibmon-fabric-0", "0", "positive integer"),
        ("ibmon-fabric-0", "two", "positive integer"),
    ],
)
def test_render_config_refuses_a_pod_outside_the_shards(
    pod: str, count: str | None, needle: str, tmp_path: Path
) -> None:
    proc, out = run_render(pod, tmp_path, count)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert not out.exists()


# --- Services, probes, scraping -------------------------------------------------------------


def test_services_and_servicemonitor_reach_both_workloads() -> None:
    monitor = find("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    job_label = monitor["spec"]["jobLabel"]
    for workload in workloads():
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        service = find("Service", f"ibmon-{component}")
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert selector.items() <= service["metadata"]["labels"].items()
        # A pod whose source fails is not ready but must stay a target (ibmon_source_up 0).
        assert service["spec"]["publishNotReadyAddresses"] is True
        (port,) = service["spec"]["ports"]
        assert port["name"] == endpoint["port"]
        container_ports = {p["name"]: p["containerPort"] for p in main_container(workload)["ports"]}
        listen = tomllib.loads(config_of(component))["prometheus"]["listen"]
        assert listen == f"0.0.0.0:{container_ports[port['targetPort']]}"
        # the IbmonDown alert watches up{job="ibmon"}: the job label must come out as "ibmon"
        assert service["metadata"]["labels"][job_label] == "ibmon"
    assert find("StatefulSet")["spec"]["serviceName"] == "ibmon-fabric"
    assert 'up{job="ibmon"}' in ALERT_RULES.read_text(encoding="utf-8")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_probes_answer_on_the_daemon_the_node_configmap_configures(tmp_path: Path) -> None:
    """The node ConfigMap's config, run for real (listen moved to loopback, sysfs root and state
    to tmp): the liveness and readiness paths of the DaemonSet answer 200 on it."""
    sys_root = tmp_path / "sys"
    write_device(sys_root, "mlx5_0")
    write_port(sys_root, "mlx5_0", 1)
    mounts = by_name(main_container(find("DaemonSet"))["volumeMounts"])
    text = config_of("node").replace(f'"{mounts["sys"]["mountPath"]}"', f'"{sys_root}"')
    assert str(sys_root) in text
    config = tmp_path / "ibmon.toml"
    config.write_text(text)
    port = free_port()
    env = dict(os.environ, IBMON_PROMETHEUS__LISTEN=f"127.0.0.1:{port}",
               IBMON_STATE__PATH=str(tmp_path / "state.json"))
    container = main_container(find("DaemonSet"))
    # The container's own command, with the mounted config path swapped for the tmp copy.
    argv = [sys.executable, "-m", *container["command"]]
    argv[argv.index("/etc/ibmon/ibmon.toml")] = str(config)
    log = tmp_path / "ibmon.log"
    with log.open("w") as stderr, subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                                   stderr=stderr) as proc:
        try:
            statuses: dict[str, int] = {}
            for _ in range(300):
                try:
                    statuses = {
                        probe: get(f"http://127.0.0.1:{port}"
                                   f"{container[probe]['httpGet']['path']}")
                        for probe in ("livenessProbe", "readinessProbe")
                    }
                except (urllib.error.URLError, ConnectionError):
                    statuses = {}
                if statuses and all(s == 200 for s in statuses.values()):
                    break
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            assert statuses == {"livenessProbe": 200, "readinessProbe": 200}
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# --- the image ------------------------------------------------------------------------------


def test_containerfile_copies_everything_the_package_build_needs() -> None:
    text = (K8S / "Containerfile").read_text(encoding="utf-8")
    copied = {word.rstrip("/") for line in text.splitlines() if line.startswith("COPY ")
              for word in line.split()[1:-1] if not word.startswith("--")}
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = {"pyproject.toml", project["project"]["readme"], *project["project"]["license-files"],
              *packages}
    assert needed <= copied, needed - copied
    image = find("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ibmon:{project['project']['version']}"


# --- the README's recipes -------------------------------------------------------------------

README = REPO / "README.md"


def readme_block(start: str) -> str:
    text = README.read_text(encoding="utf-8")
    begin = text.index(start)
    return text[begin:text.index("```", begin)]


def test_readme_shard_patch_changes_replicas_and_shard_count_together(tmp_path: Path) -> None:
    """The README's JSON patch for 3 shards, applied as kustomize would: the result validates
    and its last pod renders shard 2/3."""
    (patch,) = yaml.safe_load(readme_block("patches:   # in deploy/kubernetes/base"))["patches"]
    assert patch["target"] == {"kind": "StatefulSet", "name": "ibmon-fabric"}
    sts = find("StatefulSet")
    for op in yaml.safe_load(patch["patch"]):
        assert op["op"] == "replace"
        *parents, leaf = op["path"].strip("/").split("/")
        node: Any = sts
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: int | str = int(leaf) if isinstance(node, list) else leaf
        assert key in node or isinstance(node, list), op["path"]
        node[key] = op["value"]
    kubernetes_validate.validate(sts, KUBERNETES_VERSIONS[-1], strict=True)
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    count = {e["name"]: e.get("value") for e in init["env"]}["SHARD_COUNT"]
    assert count == str(sts["spec"]["replicas"]) == "3"
    proc, out = run_render("ibmon-fabric-2", tmp_path, count)
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads(out.read_text())["sources"][0]["shard"] == "2/3"


def test_readme_secret_commands_create_the_keys_the_pods_mount() -> None:
    commands = readme_block("kubectl -n ibmon create secret generic ibmon-mqtt")
    created: dict[str, set[str]] = {}
    for command in commands.replace("\\\n", " ").splitlines():
        m = re.search(r"create secret (generic|tls) (\S+)", command)
        if not m:
            continue
        kind, name = m.groups()
        keys = {"tls.crt", "tls.key"} if kind == "tls" else {
            f.split("=", 1)[0] for f in re.findall(r"--from-file=(\S+)", command)}
        created[name] = keys
    for workload in workloads():
        for volume in workload["spec"]["template"]["spec"]["volumes"]:
            if "secret" in volume:
                secret = volume["secret"]
                assert {i["key"] for i in secret["items"]} == created[secret["secretName"]]
