"""Offline checks of the Helm chart (helm/agent-fleet) and the local Docker stack (deploy/).

No cluster, no helm binary and no Docker engine are needed:
- helm_python (helm-python-sdk) binds Helm v4's Go SDK: lint, render, values-schema validation;
- kubernetes_validate validates rendered manifests against Kubernetes' own OpenAPI schemas;
- jsonschema / check-jsonschema cross-check values.schema.json and the compose file.

Run through helm/check.sh, which prepares the virtualenv.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

HELM_DIR = Path(__file__).resolve().parents[1]
REPO = HELM_DIR.parent
CHART_DIR = HELM_DIR / "agent-fleet"
TESTS_DIR = HELM_DIR / "tests"
FULL_VALUES_FILE = TESTS_DIR / "values-full.yaml"
BAD_VALUES_DIR = TESTS_DIR / "bad-values"
DEPLOY_DIR = REPO / "deploy"
COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yml"

KUBE_VERSION = "1.33.0"
RELEASE = "rel"
NAMESPACE = "fleet-ns"

# Kinds defined by CRDs: kubernetes-validate has no schema for them (a warning only),
# so the tests below check their structure by hand.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
}
STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
SELECTOR_KEYS = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
# The least a release needs: the broker URL, and the secrets key when rendering without a cluster.
SECRETS_KEY = "ab" * 32
MINIMAL_VALUES = {"secrets": {"amqpUrl": "amqp://fleet:pw@rabbitmq.mq.svc:5672/%2f", "secretsKey": SECRETS_KEY}}
# What the chart renders for deploy/'s compose stack: its job names, no namespace label, prefix fleet.
COMPOSE_MONITORING_VALUES = {"monitoring": {"jobLabels": {"dispatcher": "dispatcher", "worker": "worker"},
                                            "matchNamespace": False}}
SECRET_KEYS = {"FLEET_API_TOKENS", "FLEET_SECRETS_KEY", "FLEET_AMQP_URL", "FLEET_REDIS_URL", "FLEET_LLM_API_KEY"}


# --------------------------------------------------------------------------- helpers


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="session")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def full_values() -> dict:
    return load_yaml(FULL_VALUES_FILE)


def render(chart, values: dict | None = None, minimal: bool = True) -> list[dict]:
    """Render the chart (over MINIMAL_VALUES unless minimal=False) and parse every manifest;
    returns the non-empty documents."""
    values = deep_merge(MINIMAL_VALUES, values or {}) if minimal else (values or {})
    return parse_manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True))


def parse_manifests(manifests: dict[str, str]) -> list[dict]:
    docs: list[dict] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        try:
            parsed = list(yaml.safe_load_all(text))
        except yaml.YAMLError as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{path} does not parse as YAML: {e}\n{text}")
        for doc in parsed:
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{path}: a document is not a mapping: {doc!r}"
            doc.setdefault("__source__", path)
            docs.append(doc)
    return docs


def strip(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "__source__"}


def find(docs: list[dict], kind: str, component: str | None = None) -> list[dict]:
    out = [d for d in docs if d["kind"] == kind]
    if component is not None:
        out = [d for d in out if d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return out


def one(docs: list[dict], kind: str, component: str | None = None) -> dict:
    found = find(docs, kind, component)
    assert len(found) == 1, f"expected one {kind} ({component}), got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(deploy: dict) -> dict:
    containers = deploy["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_map(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


@pytest.fixture(scope="session")
def default_docs(chart) -> list[dict]:
    return render(chart)


@pytest.fixture(scope="session")
def full_docs(chart, full_values) -> list[dict]:
    return render(chart, full_values)


@pytest.fixture(params=["default", "full"])
def docs(request, default_docs, full_docs) -> list[dict]:
    return {"default": default_docs, "full": full_docs}[request.param]


# --------------------------------------------------------------------------- lint


def format_lint(report: dict, label: str) -> str:
    names = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    lines = [f"==> Linting {CHART_DIR.relative_to(REPO)} ({label})"]
    for m in report["messages"]:
        lines.append(f"[{names.get(m['severity'], m['severity'])}] {m['path']}: {m['error'].strip()}")
    failed = 1 if report["errors"] else 0
    lines.append(f"{report['total_charts_linted']} chart(s) linted, {failed} chart(s) failed")
    return "\n".join(lines)


@pytest.mark.parametrize("label", ["minimal values", "values-full.yaml"])
def test_helm_lint_strict(label, full_values):
    values = MINIMAL_VALUES if label == "minimal values" else deep_merge(MINIMAL_VALUES, full_values)
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    print(format_lint(report, label))
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


def test_chart_metadata(chart):
    meta = chart.metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "agent-fleet"
    assert meta["appVersion"] == "0.1.0"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])


def test_every_value_is_documented():
    """Every setting in values.yaml is documented (helm-docs style): each leaf key has a comment
    right above it, or sits inside a block whose key has a `# --` comment (e.g. resources)."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented with "# --") of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(- )?([A-Za-z_][\w./-]*):(.*)$", line)
        if not m:
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prev = lines[i - 1].strip() if i > 0 else ""
        commented = prev.startswith("#")
        doc_block = prev.startswith("# --") or (commented and any(
            lines[k].strip().startswith("# --") for k in range(i - 1, -1, -1)
            if lines[k].strip().startswith("#") and all(x.strip().startswith("#") for x in lines[k:i])))
        covered = any(d for _, d in stack)
        rest = m.group(4).split("#")[0].strip()
        is_leaf = rest != "" or not (i + 1 < len(lines) and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
                                     and lines[i + 1].strip())
        if is_leaf and not (commented or covered) and not m.group(2):
            undocumented.append(f"line {i + 1}: {line.strip()}")
        stack.append((indent, doc_block or covered))
    assert undocumented == [], "values without a comment:\n" + "\n".join(undocumented)


# --------------------------------------------------------------------------- rendering


def test_default_values_do_not_render_without_a_broker_url(chart):
    """There is no default broker: RabbitMQ's guest user only logs in over loopback."""
    with pytest.raises(helm.HelmRenderError, match="secrets.amqpUrl is required.*guest"):
        chart.render({"secrets": {"secretsKey": SECRETS_KEY}}, name=RELEASE, namespace=NAMESPACE)
    assert load_yaml(CHART_DIR / "values.yaml")["secrets"]["amqpUrl"] == ""


def test_render_default_values(default_docs):
    kinds = sorted({d["kind"] for d in default_docs})
    print("default render:", ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in default_docs))
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "PodDisruptionBudget", "Pod", "Secret", "Service", "ServiceAccount"]
    )
    for d in default_docs:
        assert d["apiVersion"] and d["metadata"]["name"]
        assert d["metadata"]["namespace"] == NAMESPACE


def test_render_full_values(full_docs):
    present = {(d["apiVersion"], d["kind"]) for d in full_docs}
    print("full render:", ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in full_docs))
    for expected in [
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("networking.k8s.io/v1", "Ingress"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("policy/v1", "PodDisruptionBudget"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ]:
        assert expected in present, f"{expected} not rendered with values-full.yaml"
    # existingSecret: the chart renders no Secret of its own
    assert [s["metadata"]["name"] for s in find(full_docs, "Secret")] == ["fleet-worker-keda"]
    names = [(d["kind"], d["metadata"]["name"]) for d in full_docs]
    assert len(names) == len(set(names)), "duplicate resources"


def test_kubernetes_validate_strict(docs):
    """Validate every rendered manifest against Kubernetes 1.33's schemas (strict: no unknown fields)."""
    errors, warned, validated = [], [], 0
    for d in docs:
        doc = strip(d)
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError as e:
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                warned.append(f"WARN {d['__source__']}: {e.message}")
            else:
                errors.append(f"{d['__source__']}: no schema for built-in kind: {e.message}")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{d['__source__']} {doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")
    for w in warned:
        print(w)
        warnings.warn(w)
    print(f"kubernetes-validate {KUBE_VERSION} strict: {validated} valid, {len(warned)} CRD warnings")
    assert errors == [], "\n".join(errors)
    assert validated >= 7


# --------------------------------------------------------------------------- labels and selectors


def test_standard_labels_everywhere(docs):
    for d in docs:
        labels = d["metadata"].get("labels", {})
        missing = STANDARD_LABELS - labels.keys()
        assert not missing, f"{d['kind']}/{d['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/name"] == "agent-fleet"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "agent-fleet"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["helm.sh/chart"] == "agent-fleet-0.2.0"
        for value in labels.values():
            assert isinstance(value, str) and len(value) <= 63


def test_selectors_are_name_instance_component(docs):
    pod_labels = {}
    for dep in find(docs, "Deployment"):
        selector = dep["spec"]["selector"]["matchLabels"]
        assert set(selector) == SELECTOR_KEYS, selector
        template_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template_labels.items()
        assert STANDARD_LABELS <= template_labels.keys()
        pod_labels[selector["app.kubernetes.io/component"]] = template_labels
    assert set(pod_labels) == {"dispatcher", "worker"}

    for svc in find(docs, "Service"):
        sel = svc["spec"]["selector"]
        assert set(sel) == SELECTOR_KEYS
        assert sel.items() <= pod_labels[sel["app.kubernetes.io/component"]].items()
    for pdb in find(docs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert set(sel) == SELECTOR_KEYS
        assert sel.items() <= pod_labels[sel["app.kubernetes.io/component"]].items()
    for np in find(docs, "NetworkPolicy"):
        sel = np["spec"]["podSelector"]["matchLabels"]
        assert set(sel) == SELECTOR_KEYS
        assert sel.items() <= pod_labels[sel["app.kubernetes.io/component"]].items()
    services = find(docs, "Service")
    for sm in find(docs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        assert set(sel) == SELECTOR_KEYS
        matched = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1, f"ServiceMonitor {sm['metadata']['name']} matches {len(matched)} Services"
        port_names = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert sm["spec"]["endpoints"][0]["port"] in port_names
        assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    for dep in find(docs, "Deployment"):
        for tsc in dep["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            assert tsc["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


# --------------------------------------------------------------------------- pods


def check_pod_security(pod_spec: dict, where: str) -> None:
    psc = pod_spec["securityContext"]
    assert psc["runAsNonRoot"] is True, where
    assert psc["runAsUser"] == 10001, where
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
    for c in pod_spec["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, where
        assert sc["runAsUser"] == 10001, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["capabilities"]["drop"] == ["ALL"], where
        assert "add" not in sc["capabilities"], where
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where


def test_security_context(docs):
    for dep in find(docs, "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        check_pod_security(spec, dep["metadata"]["name"])
        assert spec["automountServiceAccountToken"] is False
        mounts = {m["mountPath"] for m in container(dep).get("volumeMounts", [])}
        assert "/tmp" in mounts, "readOnlyRootFilesystem needs a writable /tmp"
    for pod in find(docs, "Pod"):
        check_pod_security(pod["spec"], pod["metadata"]["name"])


@pytest.mark.parametrize("component,port_name,port,path_env", [
    ("dispatcher", "http", 8080, ("FLEET_HTTP_ADDR", "0.0.0.0:8080")),
    ("worker", "metrics", 9090, ("FLEET_WORKER_HTTP_ADDR", "0.0.0.0:9090")),
])
def test_ports_probes_and_resources(docs, component, port_name, port, path_env):
    dep = one(docs, "Deployment", component)
    c = container(dep)
    assert c["command"] == [f"/usr/local/bin/{component}"]
    assert c["ports"] == [{"name": port_name, "containerPort": port, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port_name}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    env = env_map(c)
    assert env[path_env[0]]["value"] == path_env[1]


def test_environment_and_config(docs, full_values):
    full = any(d["kind"] == "Ingress" for d in docs)
    cm = one(docs, "ConfigMap", "config")
    assert cm["data"]["FLEET_LOG_FORMAT"] in ("json", "text")
    assert cm["data"]["FLEET_TOPOLOGY_PREFIX"] == ("acme" if full else "fleet")
    assert cm["data"]["RUST_LOG"]
    assert cm["data"]["FLEET_ALLOW_PRIVATE_CALLBACKS"] == "false"
    if full:
        assert cm["data"]["FLEET_LLM_BASE_URL"] == full_values["config"]["llmBaseUrl"]
        assert cm["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == full_values["config"]["otlpEndpoint"]
        assert cm["data"]["FLEET_ARTIFACTS_URL"] == full_values["config"]["artifactsUrl"]
        assert cm["data"]["FLEET_ARTIFACT_MAX_BYTES"] == str(full_values["config"]["artifactMaxBytes"])
        assert "FLEET_RETRY_DELAYS" not in cm["data"]  # extraEnv is EnvVar list, in the containers
    else:
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in cm["data"]
    for v in cm["data"].values():
        assert isinstance(v, str)

    secret_name = "fleet-credentials" if full else f"{RELEASE}-agent-fleet"
    # values-full.yaml maps FLEET_AMQP_URL to the RabbitMQ operator's Secret and key
    mapped = {"FLEET_AMQP_URL": ("rabbitmq-default-user", "connection_string")} if full else {}
    expected_secret_env = {
        "dispatcher": {"FLEET_API_TOKENS", "FLEET_SECRETS_KEY", "FLEET_AMQP_URL", "FLEET_REDIS_URL"},
        "worker": {"FLEET_SECRETS_KEY", "FLEET_AMQP_URL", "FLEET_REDIS_URL", "FLEET_LLM_API_KEY"},
    }
    for component, keys in expected_secret_env.items():
        c = container(one(docs, "Deployment", component))
        assert c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
        env = env_map(c)
        refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "valueFrom" in e}
        assert set(refs) == keys
        for name, ref in refs.items():
            assert (ref["name"], ref["key"]) == mapped.get(name, (secret_name, name))
            assert ref.get("optional", False) == (name == "FLEET_LLM_API_KEY")
        assert env["OTEL_SERVICE_NAME"]["value"] == f"fleet-{component}"
        if full:
            assert env["FLEET_RETRY_DELAYS"]["value"] == "1,5,30"
        # every plain env value is a string (Kubernetes rejects numbers)
        assert all(isinstance(e["value"], str) for e in env.values() if "value" in e)

    w = env_map(container(one(docs, "Deployment", "worker")))
    grace = 40 if full else 25
    assert w["FLEET_SHUTDOWN_GRACE"]["value"] == str(grace)
    assert w["FLEET_WORKER_CONCURRENCY"]["value"] == ("16" if full else "32")
    worker_spec = one(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    assert worker_spec["terminationGracePeriodSeconds"] == grace + 5


def test_tls_files_are_mounted_and_named(chart, default_docs, full_docs):
    # Default: system roots off, nothing mounted.
    for component in ("dispatcher", "worker"):
        deploy = one(default_docs, "Deployment", component)
        env = env_map(container(deploy))
        assert env["FLEET_TLS_NATIVE_ROOTS"]["value"] == "false"
        assert not {"FLEET_TLS_CA_FILE", "FLEET_TLS_CLIENT_CERT_FILE", "FLEET_TLS_CLIENT_KEY_FILE"} & set(env)
        assert [v["name"] for v in deploy["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    # values-full: a CA bundle from a ConfigMap and a kubernetes.io/tls client certificate.
    for component in ("dispatcher", "worker"):
        deploy = one(full_docs, "Deployment", component)
        c = container(deploy)
        env = env_map(c)
        assert env["FLEET_TLS_NATIVE_ROOTS"]["value"] == "true"
        assert env["FLEET_TLS_CA_FILE"]["value"] == "/etc/fleet/tls/ca/ca.pem"
        assert env["FLEET_TLS_CLIENT_CERT_FILE"]["value"] == "/etc/fleet/tls/client/tls.crt"
        assert env["FLEET_TLS_CLIENT_KEY_FILE"]["value"] == "/etc/fleet/tls/client/tls.key"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["tls-ca"]["mountPath"] == "/etc/fleet/tls/ca" and mounts["tls-ca"]["readOnly"]
        assert mounts["tls-client"]["mountPath"] == "/etc/fleet/tls/client"
        volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
        assert volumes["tls-ca"]["configMap"] == {"name": "fleet-ca-bundle", "items": [{"key": "ca.pem", "path": "ca.pem"}]}
        assert volumes["tls-client"]["secret"]["secretName"] == "fleet-client-tls"
    # A Secret wins over a ConfigMap for the CA bundle.
    docs = render(chart, {"tls": {"ca": {"secretName": "ca-secret", "configMapName": "ignored"}}})
    volumes = {v["name"]: v for v in one(docs, "Deployment", "worker")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls-ca"] == {"name": "tls-ca", "secret": {"secretName": "ca-secret", "items": [{"key": "ca.crt", "path": "ca.pem"}]}}
    assert "tls-client" not in volumes


def test_services_catalog_is_mounted_and_named(chart, default_docs, full_docs, full_values):
    # Default: no catalog, nothing mounted.
    d = one(default_docs, "Deployment", "dispatcher")
    assert "FLEET_SERVICES_CATALOG" not in env_map(container(d))
    assert not find(default_docs, "ConfigMap", "services-catalog")
    # values-full: the entries of the values, in a ConfigMap of the chart's, mounted where the
    # setting names it, its checksum on the pods.
    cm = one(full_docs, "ConfigMap", "services-catalog")
    assert json.loads(cm["data"]["services.json"]) == full_values["dispatcher"]["servicesCatalog"]["services"]
    d = one(full_docs, "Deployment", "dispatcher")
    c = container(d)
    assert env_map(c)["FLEET_SERVICES_CATALOG"]["value"] == "/etc/fleet/services/services.json"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["services-catalog"] == {"name": "services-catalog", "mountPath": "/etc/fleet/services", "readOnly": True}
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    assert volumes["services-catalog"]["configMap"] == {
        "name": cm["metadata"]["name"], "items": [{"key": "services.json", "path": "services.json"}]}
    assert "checksum/services-catalog" in d["spec"]["template"]["metadata"]["annotations"]
    assert "FLEET_SERVICES_CATALOG" not in env_map(container(one(full_docs, "Deployment", "worker")))
    # An operator's ConfigMap, under its own key: mounted, not rendered.
    docs = render(chart, {"dispatcher": {"servicesCatalog": {"configMapName": "my-services", "key": "catalog.json"}}})
    assert not find(docs, "ConfigMap", "services-catalog")
    d = one(docs, "Deployment", "dispatcher")
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    assert volumes["services-catalog"]["configMap"] == {
        "name": "my-services", "items": [{"key": "catalog.json", "path": "services.json"}]}
    assert "checksum/services-catalog" not in d["spec"]["template"]["metadata"].get("annotations", {})
    # The example catalog deploy/ ships is one the schema takes.
    example = json.loads((DEPLOY_DIR / "services-catalog.example.json").read_text())
    docs = render(chart, {"dispatcher": {"servicesCatalog": {"services": example}}})
    assert json.loads(one(docs, "ConfigMap", "services-catalog")["data"]["services.json"]) == example
    for doc in docs:
        kubernetes_validate.validate(strip(doc), KUBE_VERSION, strict=True)


def test_generated_secret(default_docs):
    secret = one(default_docs, "Secret", "config")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(data) == SECRET_KEYS - {"FLEET_LLM_API_KEY"}
    assert data["FLEET_SECRETS_KEY"] == SECRETS_KEY
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert all(len(t) >= 16 for t in data["FLEET_API_TOKENS"].split(","))
    assert data["FLEET_AMQP_URL"].startswith("amqp://")
    assert data["FLEET_REDIS_URL"].startswith("redis://")


def test_explicit_secret_values(chart):
    key = "ab" * 32
    docs = render(chart, minimal=False, values={"secrets": {
        "apiTokens": ["token-one-0123456789", "token-two-0123456789"],
        "secretsKey": key,
        "llmApiKey": "sk-test",
        "amqpUrl": "amqps://u:p@mq.example.com:5671/fleet",
        "redisUrl": "rediss://redis.example.com:6380/1",
    }})
    data = {k: base64.b64decode(v).decode() for k, v in one(docs, "Secret")["data"].items()}
    assert data == {
        "FLEET_API_TOKENS": "token-one-0123456789,token-two-0123456789",
        "FLEET_SECRETS_KEY": key,
        "FLEET_LLM_API_KEY": "sk-test",
        "FLEET_AMQP_URL": "amqps://u:p@mq.example.com:5671/fleet",
        "FLEET_REDIS_URL": "rediss://redis.example.com:6380/1",
    }


# --------------------------------------------------------------------------- scaling


def hpas_for(docs: list[dict], deployment: dict) -> list[dict]:
    return [h for h in find(docs, "HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]]


def test_static_scaling_by_default(default_docs):
    for component in ("dispatcher", "worker"):
        dep = one(default_docs, "Deployment", component)
        assert dep["spec"]["replicas"] == 2
        assert hpas_for(default_docs, dep) == []
    assert find(default_docs, "ScaledObject") == []


def test_keda_on_means_no_worker_hpa_and_no_replicas(full_docs):
    worker = one(full_docs, "Deployment", "worker")
    assert "replicas" not in worker["spec"], "KEDA owns the worker replica count"
    assert hpas_for(full_docs, worker) == [], "KEDA makes its own HPA; the chart must not render one"

    so = one(full_docs, "ScaledObject", "worker")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": worker["metadata"]["name"]}
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["maxReplicaCount"] == 50
    triggers = so["spec"]["triggers"]
    assert [t["metadata"]["queueName"] for t in triggers] == [
        "acme.work.tool_calls", "acme.work.tool_calls.light", "acme.work.turns", "acme.work.turns.light", "acme.work.webhooks"], \
        "KEDA watches every work queue"
    trigger = triggers[0]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"]["mode"] == "QueueLength"
    assert trigger["metadata"]["value"] == "20"
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), "KEDA metadata values are strings"

    ta = one(full_docs, "TriggerAuthentication", "worker")
    assert all(t["authenticationRef"]["name"] == ta["metadata"]["name"] for t in triggers)
    # the host is worker.keda.host, in a Secret of its own, not FLEET_AMQP_URL
    assert ta["spec"]["secretTargetRef"] == [{"parameter": "host", "name": "fleet-worker-keda", "key": "host"}]
    (host_secret,) = [s for s in find(full_docs, "Secret") if s["metadata"]["name"] == "fleet-worker-keda"]
    assert base64.b64decode(host_secret["data"]["host"]).decode() == "amqps://keda:secret@rabbitmq.mq.svc:5671/fleet"

    # the dispatcher keeps its own HPA, and with it no replicas either
    dispatcher = one(full_docs, "Deployment", "dispatcher")
    assert "replicas" not in dispatcher["spec"]
    (hpa,) = hpas_for(full_docs, dispatcher)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 8
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}


def test_worker_cpu_hpa_when_keda_off(chart):
    docs = render(chart, {"worker": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 9}}})
    worker = one(docs, "Deployment", "worker")
    assert "replicas" not in worker["spec"]
    (hpa,) = hpas_for(docs, worker)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert find(docs, "ScaledObject") == [] and find(docs, "TriggerAuthentication") == []


def test_keda_default_queue_and_several_queues(chart):
    docs = render(chart, {"worker": {"keda": {"enabled": True}}})
    assert [t["metadata"]["queueName"] for t in one(docs, "ScaledObject", "worker")["spec"]["triggers"]] == [
        "fleet.work.tool_calls", "fleet.work.tool_calls.light", "fleet.work.turns", "fleet.work.turns.light",
        "fleet.work.webhooks"]
    docs = render(chart, {"worker": {"keda": {"enabled": True, "queues": ["tool_calls", "webhooks"]}}})
    so = one(docs, "ScaledObject", "worker")
    assert [t["metadata"]["queueName"] for t in so["spec"]["triggers"]] == [
        "fleet.work.tool_calls", "fleet.work.webhooks"]
    ta = one(docs, "TriggerAuthentication", "worker")
    assert ta["spec"]["secretTargetRef"][0] == {"parameter": "host", "name": f"{RELEASE}-agent-fleet-worker-keda",
                                                "key": "host"}
    assert "replicas" not in one(docs, "Deployment", "worker")["spec"]


def test_keda_host_is_one_broker_not_the_failover_list(chart):
    """FLEET_AMQP_URL may list several brokers; KEDA gets the first one (or worker.keda.host)."""
    urls = "amqps://f:pw@mq-0.mq:5671/fleet,amqps://f:pw@mq-1.mq:5671/fleet"
    docs = render(chart, {"secrets": {"amqpUrl": urls}, "worker": {"keda": {"enabled": True}}})
    (s,) = [d for d in find(docs, "Secret") if d["metadata"]["name"].endswith("-worker-keda")]
    assert base64.b64decode(s["data"]["host"]).decode() == "amqps://f:pw@mq-0.mq:5671/fleet"
    # with an existing Secret the chart cannot split the URL: it asks for the host
    with pytest.raises(helm.HelmRenderError, match="worker.keda.host"):
        chart.render(deep_merge(MINIMAL_VALUES, {"secrets": {"existingSecret": "x"}, "worker": {"keda": {"enabled": True}}}),
                     name=RELEASE, namespace=NAMESPACE)
    docs = render(chart, {"secrets": {"existingSecret": "x"},
                          "worker": {"keda": {"enabled": True, "hostSecret": {"name": "mq", "key": "uri"}}}})
    assert one(docs, "TriggerAuthentication", "worker")["spec"]["secretTargetRef"][0] == {
        "parameter": "host", "name": "mq", "key": "uri"}
    assert not [d for d in find(docs, "Secret") if d["metadata"]["name"].endswith("-worker-keda")]


def test_keda_message_rate_needs_http(chart):
    with pytest.raises(helm.HelmRenderError, match="MessageRate"):
        chart.render(deep_merge(MINIMAL_VALUES, {"worker": {"keda": {"enabled": True, "mode": "MessageRate"}}}),
                     name=RELEASE, namespace=NAMESPACE)
    docs = render(chart, {"worker": {"keda": {"enabled": True, "mode": "MessageRate", "protocol": "http",
                                              "hostSecret": {"name": "mq-mgmt", "key": "url"}}}})
    ta = one(docs, "TriggerAuthentication", "worker")
    assert ta["spec"]["secretTargetRef"][0] == {"parameter": "host", "name": "mq-mgmt", "key": "url"}


def test_pdbs(docs):
    pdbs = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in find(docs, "PodDisruptionBudget")}
    assert set(pdbs) == {"dispatcher", "worker"}
    for p in pdbs.values():
        assert ("minAvailable" in p["spec"]) != ("maxUnavailable" in p["spec"])


# --------------------------------------------------------------------------- monitoring


def test_prometheus_rule_comes_from_files_alerts(full_docs):
    rule_file = load_yaml(CHART_DIR / "files" / "alerts.yml")
    rule = one(full_docs, "PrometheusRule", "monitoring")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert [r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]] == [
        r.get("alert") for g in rule_file["groups"] for r in g["rules"]]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts, "no rules"
    for g in rule["spec"]["groups"]:
        assert g["name"]
        for r in g["rules"]:
            assert ("alert" in r) != ("record" in r), r
            assert isinstance(r["expr"], (str, int)) and str(r["expr"]).strip()
    assert any(r.get("alert") == "FleetWorkerDown" for r in alerts)


def test_grafana_dashboard_configmap(full_docs):
    dashboards = [c for c in find(full_docs, "ConfigMap", "monitoring")]
    assert len(dashboards) == 1
    cm = dashboards[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Agent fleet"
    dashboard = json.loads(cm["data"]["fleet-dashboard.json"])
    assert dashboard["panels"] == json.loads((CHART_DIR / "files" / "fleet-dashboard.json").read_text())["panels"]
    constants = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "constant"}
    assert constants == {"dispatcher_job": "fleet-dispatcher", "worker_job": "fleet-worker",
                         "namespace": NAMESPACE, "queue_prefix": "acme"}
    assert dashboard["title"] and isinstance(dashboard["panels"], list)


def test_service_monitors(full_docs):
    sms = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in find(full_docs, "ServiceMonitor")}
    assert set(sms) == {"dispatcher", "worker"}
    assert sms["dispatcher"]["spec"]["endpoints"][0]["port"] == "http"
    assert sms["worker"]["spec"]["endpoints"][0]["port"] == "metrics"
    services = find(full_docs, "Service")
    for component, sm in sms.items():
        # no jobLabel: Prometheus Operator's job label is then the Service name, unique to this
        # release, which the alert rules and the dashboard select on
        assert "jobLabel" not in sm["spec"]
        (svc,) = [s for s in services if s["metadata"]["labels"]["app.kubernetes.io/component"] == component]
        assert svc["metadata"]["name"] == f"fleet-{component}"
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert sm["spec"]["endpoints"][0]["interval"] == "15s"


def test_network_policies(full_docs):
    nps = {n["metadata"]["labels"]["app.kubernetes.io/component"]: n for n in find(full_docs, "NetworkPolicy")}
    assert set(nps) == {"dispatcher", "worker"}
    d_ingress = nps["dispatcher"]["spec"]["ingress"]
    assert d_ingress[0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = d_ingress[0]["from"]
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "agent-fleet",
                                            "app.kubernetes.io/instance": RELEASE,
                                            "app.kubernetes.io/component": "test"}}} in peers
    assert nps["worker"]["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    for n in nps.values():
        assert n["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert {"port": 53, "protocol": "UDP"} in n["spec"]["egress"][0]["ports"]


def test_egress_rules_from_values(chart):
    broker_peer = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rabbitmq"}}}
    llm_peer = {"ipBlock": {"cidr": "203.0.113.10/32"}}
    docs = render(chart, {"config": {"otlpEndpoint": "http://otel:4318"}, "networkPolicy": {
        "enabled": True, "egress": {"enabled": True, "broker": {"to": [broker_peer]}, "llm": {"to": [llm_peer]},
                                    "extraRules": [{"ports": [{"port": 8443, "protocol": "TCP"}]}]}}})
    nps = {n["metadata"]["labels"]["app.kubernetes.io/component"]: n for n in find(docs, "NetworkPolicy")}

    def ports(rule):
        return sorted(p["port"] for p in rule["ports"])

    worker = nps["worker"]["spec"]["egress"]
    assert [ports(r) for r in worker] == [[53, 53], [5671, 5672], [6379], [443], [80, 443], [4318], [8443]]
    assert worker[1]["to"] == [broker_peer] and worker[3]["to"] == [llm_peer]
    assert "to" not in worker[2], "an empty `to` is any destination on the ports"
    # the dispatcher calls neither the model nor callbacks
    assert [ports(r) for r in nps["dispatcher"]["spec"]["egress"]] == [[53, 53], [5671, 5672], [6379], [4318], [8443]]


def test_data_sources_reach_the_listed_databases_only(chart):
    db_peer = {"ipBlock": {"cidr": "10.20.0.0/16"}}
    values = {"config": {"dataSourceNetworks": "10.20.0.0/16"},
              "networkPolicy": {"enabled": True, "egress": {"enabled": True, "dataSources": {"to": [db_peer]}}}}
    docs = render(chart, values)
    config = [c for c in find(docs, "ConfigMap") if "FLEET_DATA_SOURCE_NETWORKS" in c.get("data", {})]
    assert config and config[0]["data"]["FLEET_DATA_SOURCE_NETWORKS"] == "10.20.0.0/16"
    assert config[0]["data"]["FLEET_ALLOW_PRIVATE_CALLBACKS"] == "false", "callbacks stay public"
    nps = {n["metadata"]["labels"]["app.kubernetes.io/component"]: n for n in find(docs, "NetworkPolicy")}
    worker = nps["worker"]["spec"]["egress"]
    assert worker[-1] == {"ports": [{"port": 5432, "protocol": "TCP"}, {"port": 3306, "protocol": "TCP"}], "to": [db_peer]}
    assert all(r.get("to") != [db_peer] for r in nps["dispatcher"]["spec"]["egress"]), "only workers reach databases"
    # Without a list, no rule opens the databases' ports.
    plain = render(chart, {"networkPolicy": {"enabled": True, "egress": {"enabled": True}}})
    worker = {n["metadata"]["labels"]["app.kubernetes.io/component"]: n for n in find(plain, "NetworkPolicy")}["worker"]
    assert all(5432 not in [p["port"] for p in r["ports"]] for r in worker["spec"]["egress"])


def test_ingress(full_docs):
    ing = one(full_docs, "Ingress", "dispatcher")
    assert ing["spec"]["ingressClassName"] == "nginx"
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    svc = one(full_docs, "Service", "dispatcher")
    assert backend == {"name": svc["metadata"]["name"], "port": {"name": "http"}}
    assert ing["spec"]["tls"] == [{"hosts": ["fleet.example.com"], "secretName": "fleet-tls"}]


def test_helm_test_pod_curls_readyz(docs):
    pod = one(docs, "Pod", "test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    svc = one(docs, "Service", "dispatcher")
    url = f"http://{svc['metadata']['name']}.{NAMESPACE}.svc:{svc['spec']['ports'][0]['port']}/readyz"
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["curl"] and url in c["args"] and "--fail" in c["args"]


def test_notes_render(chart, full_values):
    for values in ({}, full_values):
        notes = chart.render(deep_merge(MINIMAL_VALUES, values), name=RELEASE, namespace=NAMESPACE)["agent-fleet/templates/NOTES.txt"]
        assert "helm test" in notes and "port-forward" in notes


# --------------------------------------------------------------------------- values schema


BAD_VALUES = sorted(BAD_VALUES_DIR.glob("*.yaml"))


def test_good_values_pass_schema(chart, full_values):
    chart.validate_schema(None)
    chart.validate_schema(full_values)
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(load_yaml(CHART_DIR / "values.yaml"), schema, cls=jsonschema.Draft7Validator)
    jsonschema.validate(deep_merge(load_yaml(CHART_DIR / "values.yaml"), full_values), schema,
                        cls=jsonschema.Draft7Validator)
    out = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(CHART_DIR / "values.schema.json"),
         str(CHART_DIR / "values.yaml")],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_there_are_bad_values_files():
    assert len(BAD_VALUES) >= 8


@pytest.mark.parametrize("path", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_schema_rejects_bad_values(chart, path):
    values = load_yaml(path)
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(values)
    print(f"{path.name}: {str(err.value).strip()}")
    # rendering (what `helm install` does) refuses them as well
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    # and an independent validator agrees, on the values as Helm would merge them
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    merged = deep_merge(load_yaml(CHART_DIR / "values.yaml"), values)
    assert list(jsonschema.Draft7Validator(schema).iter_errors(merged)), f"jsonschema accepts {path.name}"


# --------------------------------------------------------------------------- deploy/ (Docker)


COMPOSE_DEFAULT = re.compile(r"^\$\{(?P<name>[A-Z0-9_]+):-(?P<default>[^}]*)\}$")


def resolve(value: Any) -> str:
    """Resolve compose's ${VAR:-default} to its default (the value a fresh checkout runs with)."""
    text = str(value)
    m = COMPOSE_DEFAULT.match(text)
    return m.group("default") if m else text


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: resolve(v) for k, v in env.items()}


@pytest.fixture(scope="session")
def compose() -> dict:
    return load_yaml(COMPOSE_FILE)


def test_compose_schema():
    out = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_services(compose):
    services = compose["services"]
    assert {"rabbitmq", "redis", "dispatcher", "worker", "prometheus", "grafana", "jaeger"} <= set(services)
    assert services["rabbitmq"]["image"].startswith("rabbitmq:3.13-management")
    assert {"5672:5672", "15672:15672"} <= set(services["rabbitmq"]["ports"])
    assert services["redis"]["image"].split(":")[0] == "redis" and services["redis"]["image"].split(":")[1].startswith("7")
    redis_cmd = services["redis"]["command"]
    redis_cmd = " ".join(redis_cmd) if isinstance(redis_cmd, list) else redis_cmd
    assert "--maxmemory-policy noeviction" in redis_cmd
    assert "8080:8080" in services["dispatcher"]["ports"]
    assert services["worker"]["deploy"]["replicas"] == 2
    assert "ports" not in services["worker"], "replicas cannot share a host port"
    for name in ("dispatcher", "worker"):
        s = services[name]
        assert s["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert s["command"] == [f"/usr/local/bin/{name}"]
    assert services["jaeger"]["image"].startswith("jaegertracing/")
    # host.docker.internal (the default FLEET_LLM_BASE_URL) resolves on Linux too
    for name in ("dispatcher", "worker"):
        assert "host.docker.internal:host-gateway" in services[name]["extra_hosts"]


def test_compose_healthchecks_and_dependencies(compose):
    services = compose["services"]
    for name in ("rabbitmq", "redis", "dispatcher", "worker", "prometheus", "grafana"):
        hc = services[name].get("healthcheck")
        assert hc and hc["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    assert services["dispatcher"]["healthcheck"]["test"][-1] == "http://127.0.0.1:8080/readyz"
    assert services["worker"]["healthcheck"]["test"][-1] == "http://127.0.0.1:9090/readyz"
    for name in ("dispatcher", "worker"):
        deps = services[name]["depends_on"]
        assert deps["rabbitmq"]["condition"] == "service_healthy"
        assert deps["redis"]["condition"] == "service_healthy"
    for name, s in services.items():
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy, but it has none"


def test_compose_fleet_environment(compose):
    services = compose["services"]
    for name in ("dispatcher", "worker"):
        env = compose_env(services[name])
        for key in ("FLEET_AMQP_URL", "FLEET_REDIS_URL", "FLEET_API_TOKENS", "FLEET_SECRETS_KEY",
                    "FLEET_LOG_FORMAT", "FLEET_ALLOW_PRIVATE_CALLBACKS", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            assert key in env, f"{name} lacks {key}"
        assert env["FLEET_AMQP_URL"].startswith("amqp://") and "@rabbitmq:5672" in env["FLEET_AMQP_URL"]
        assert env["FLEET_REDIS_URL"].startswith("redis://redis:6379")
        assert all(len(t.strip()) >= 16 for t in env["FLEET_API_TOKENS"].split(","))
        assert re.fullmatch(r"[0-9a-fA-F]{64}", env["FLEET_SECRETS_KEY"])
        assert env["FLEET_LOG_FORMAT"] == "json"
        assert env["FLEET_ALLOW_PRIVATE_CALLBACKS"] == "true"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert compose_env(services["dispatcher"])["FLEET_HTTP_ADDR"] == "0.0.0.0:8080"
    worker_env = compose_env(services["worker"])
    assert worker_env["FLEET_WORKER_HTTP_ADDR"] == "0.0.0.0:9090"
    assert int(worker_env["FLEET_SHUTDOWN_GRACE"]) + 5 == int(services["worker"]["stop_grace_period"].rstrip("s"))


def bind_mounts(service: dict) -> list[tuple[Path, str]]:
    out = []
    for v in service.get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith("."):
            out.append(((DEPLOY_DIR / src).resolve(), dst))
    return out


def test_compose_prometheus(compose):
    prom = compose["services"]["prometheus"]
    mounts = {dst: src for src, dst in bind_mounts(prom)}
    assert mounts["/etc/prometheus/prometheus.yml"] == DEPLOY_DIR / "prometheus-compose" / "prometheus.yml"
    assert mounts["/etc/prometheus/rules"] == DEPLOY_DIR / "prometheus"
    config = load_yaml(DEPLOY_DIR / "prometheus-compose" / "prometheus.yml")
    assert config["rule_files"] == ["/etc/prometheus/rules/alerts.yml"]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    # the alert rules (deploy/prometheus/alerts.yml) select on job="dispatcher" / job="worker"
    assert jobs["dispatcher"]["static_configs"][0]["targets"] == ["dispatcher:8080"]
    assert jobs["dispatcher"]["metrics_path"] == "/metrics"
    worker_sd = jobs["worker"]["dns_sd_configs"][0]
    assert worker_sd["names"] == ["worker"] and worker_sd["port"] == 9090
    assert jobs["worker"]["metrics_path"] == "/metrics"


def test_compose_grafana(compose):
    graf = compose["services"]["grafana"]
    mounts = {dst: src for src, dst in bind_mounts(graf)}
    ds_dir = mounts["/etc/grafana/provisioning/datasources"]
    db_dir = mounts["/etc/grafana/provisioning/dashboards"]
    assert ds_dir == DEPLOY_DIR / "grafana-provisioning" / "datasources"
    assert mounts["/etc/grafana/dashboards/fleet"] == DEPLOY_DIR / "grafana"
    datasources = load_yaml(ds_dir / "datasources.yml")["datasources"]
    prom = [d for d in datasources if d["type"] == "prometheus"]
    assert prom and prom[0]["url"] == "http://prometheus:9090" and prom[0]["isDefault"] is True
    providers = load_yaml(db_dir / "dashboards.yml")["providers"]
    assert providers[0]["options"]["path"] == "/etc/grafana/dashboards/fleet"
    assert graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].startswith(
        providers[0]["options"]["path"] + "/")


def test_compose_bind_mount_sources_exist(compose):
    missing = [f"{name}: {src}" for name, s in compose["services"].items()
               for src, _ in bind_mounts(s) if not src.exists()]
    assert missing == [], "bind-mount sources missing:\n" + "\n".join(missing)
    dashboard = DEPLOY_DIR / "grafana" / "fleet-dashboard.json"
    assert dashboard.is_file(), f"{dashboard} is missing"
    assert json.loads(dashboard.read_text())["panels"] is not None
    alerts = load_yaml(DEPLOY_DIR / "prometheus" / "alerts.yml")
    assert alerts["groups"]


def test_dockerfile():
    text = (DEPLOY_DIR / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    assert [f[1] for f in froms] == ["builder", "prebuilt", "binaries", "debian-base", "runtime"]
    # Docker builds the binaries and the Debian base itself; scripts/image.sh picks the prebuilt
    # binaries and its own base through these two arguments.
    assert [f[0] for f in froms if f[1] in ("binaries", "runtime")] == ["${BINARIES}", "${RUNTIME_BASE}"]
    assert "ARG BINARIES=builder" in text and "ARG RUNTIME_BASE=debian-base" in text
    assert "ARG RUST_IMAGE=rust:1.95-bookworm" in text
    assert "ARG RUNTIME_IMAGE=debian:bookworm-slim" in text
    assert text.count("cargo build --release --locked -p fleet-dispatcher -p fleet-worker -p fleetctl") == 2
    for member in ("protocol", "platform", "dispatcher", "worker", "fleetctl", "tests"):
        assert f"COPY {member}/Cargo.toml" in text
    assert "ca-certificates" in text and not re.search(r"apt-get install[^\n]*curl", text), "no curl"
    assert "--uid 10001" in text and re.search(r"^USER 10001:10001$", text, re.M)
    for binary in ("dispatcher", "worker", "fleetctl"):
        assert f"/out/{binary}" in text
    assert "/usr/local/bin/" in text
    runtime = text.split("AS runtime")[1]
    assert not re.search(r"^RUN ", runtime, re.M), "the runtime stage builds on a base without a shell"
    for label in ("version", "revision", "source", "created", "licenses", "title"):
        assert f"org.opencontainers.image.{label}=" in runtime
    # The image's health check is the chart's readiness probe: /readyz every 5 s, 3 s timeout, 3 failures.
    values = load_yaml(CHART_DIR / "values.yaml")
    for component in ("dispatcher", "worker"):
        probe = values[component]["readinessProbe"]
        assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (5, 3, 3)
    assert re.search(r"HEALTHCHECK --interval=5s --timeout=3s --start-period=\d+s --retries=3 \\\n\s+"
                     r'CMD \["/usr/local/bin/fleetctl", "probe", "--path", "/readyz"\]', runtime), runtime
    assert 'CMD ["/usr/local/bin/dispatcher"]' in runtime


def test_chart_default_image_is_what_make_image_builds(chart):
    """`make image` (scripts/image.sh) tags localhost/agent-fleet:<workspace version>; the chart's
    default image is repository agent-fleet with the tag appVersion, so the same name and tag
    (podman's `localhost/` is the registry: image.registry=localhost for an image loaded into a node)."""
    import tomllib

    script = (REPO / "scripts" / "image.sh").read_text()
    assert re.search(r"^tag=localhost/agent-fleet:\$version$", script, re.M)
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert load_yaml(CHART_DIR / "Chart.yaml")["appVersion"] == version, "appVersion is the workspace's version"
    values = load_yaml(CHART_DIR / "values.yaml")
    assert values["image"]["repository"] == "agent-fleet" and values["image"]["tag"] == ""
    docs = render(chart, {"image": {"registry": "localhost"}})
    for name in ("dispatcher", "worker"):
        assert container(one(docs, "Deployment", name))["image"] == f"localhost/agent-fleet:{version}"
    # the workspace members named in the Dockerfile are the workspace's members
    cargo = (REPO / "Cargo.toml").read_text()
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", cargo).group(1)
    assert sorted(re.findall(r'"([^"]+)"', members)) == sorted(
        ["protocol", "platform", "dispatcher", "worker", "fleetctl", "tests"])
    ignore = (DEPLOY_DIR / "Dockerfile.dockerignore").read_text()
    assert "**/target" in ignore


def test_dockerfile_stubs_cover_every_declared_target():
    """The dependency layer stubs each target path the members declare (found by the Dockerfile's sed)
    and the library crates; a new library crate must be added to its `for lib in` list."""
    import tomllib

    text = (DEPLOY_DIR / "Dockerfile").read_text()
    lib_list = re.search(r"for lib in ([^;]*); do", text).group(1).split()
    stub_sed = re.compile(r'^path *= *"(.*)".*$', re.M)  # what the Dockerfile's sed extracts
    for member in ("protocol", "platform", "dispatcher", "worker", "fleetctl", "tests"):
        manifest_text = (REPO / member / "Cargo.toml").read_text()
        manifest = tomllib.loads(manifest_text)
        declared = [t["path"] for key in ("bin", "test", "bench", "example")
                    for t in manifest.get(key, []) if "path" in t]
        if "path" in manifest.get("lib", {}):
            declared.append(manifest["lib"]["path"])
        stubbed = stub_sed.findall(manifest_text)
        assert sorted(declared) == sorted(stubbed), f"{member}: declared {declared}, stubbed {stubbed}"
        has_lib = (REPO / member / "src" / "lib.rs").exists() or "lib" in manifest
        assert has_lib == (member in lib_list), f"{member}: library crate? {has_lib}; Dockerfile libs {lib_list}"
        if not any(p == "src/main.rs" for p in declared):
            assert not (REPO / member / "src" / "main.rs").exists(), f"{member}/src/main.rs is not stubbed"


def test_chart_renders_the_deploy_rules_and_dashboard(tmp_path):
    """files/ may be replaced by deploy/prometheus/alerts.yml and deploy/grafana/fleet-dashboard.json:
    the chart must carry them unchanged (no templating of the rules' {{ $labels }})."""
    import shutil

    rules_src = DEPLOY_DIR / "prometheus" / "alerts.yml"
    dashboard_src = DEPLOY_DIR / "grafana" / "fleet-dashboard.json"
    if not (rules_src.is_file() and dashboard_src.is_file()):
        pytest.skip("deploy/ monitoring files not present")
    copy_dir = tmp_path / "agent-fleet"
    shutil.copytree(CHART_DIR, copy_dir)
    shutil.copy(rules_src, copy_dir / "files" / "alerts.yml")
    shutil.copy(dashboard_src, copy_dir / "files" / "fleet-dashboard.json")
    with helm.Chart.load(copy_dir) as c:
        docs = render(c, deep_merge(COMPOSE_MONITORING_VALUES,
                                    {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}))
    # with the compose stack's jobs and the default prefix and thresholds, the chart's rewrite of
    # the rules is the identity: deploy/'s promtool unit tests test what the chart installs
    rule = one(docs, "PrometheusRule", "monitoring")
    assert rule["spec"]["groups"] == load_yaml(rules_src)["groups"]
    cm = one(docs, "ConfigMap", "monitoring")
    assert json.loads(cm["data"]["fleet-dashboard.json"]) == json.loads(dashboard_src.read_text())
    size = sum(len(v) for v in cm["data"].values())
    assert size < 1024 * 1024, "a ConfigMap holds at most 1 MiB"


# --------------------------------------------------------------------------- secrets in a cluster


from fake_kube import FakeKube  # noqa: E402  (helm/tests is on sys.path under pytest)


def render_in_cluster(chart, kube: FakeKube, values: dict, **opts) -> list[dict]:
    """Render as `helm install/upgrade` does: lookup reads the (fake) API server."""
    with helm.Config(kube_apiserver=kube.url, namespace=NAMESPACE, storage_driver="memory") as cfg:
        return parse_manifests(cfg.render(chart, values, name=RELEASE, namespace=NAMESPACE, **opts))


def secret_data(docs: list[dict]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in one(docs, "Secret", "config")["data"].items()}


def test_secrets_key_is_required_without_a_cluster(chart):
    values = {"secrets": {"amqpUrl": "amqp://u:p@mq:5672/%2f"}}
    for opts in ({"is_install": True}, {"is_upgrade": True}):
        with pytest.raises(helm.HelmRenderError, match="secrets.secretsKey is required when rendering without a cluster"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE, **opts)
    # an existing Secret needs no key from values
    render(chart, {"secrets": {"existingSecret": "mine"}}, minimal=False)


def test_install_then_upgrade_keeps_the_generated_key(chart):
    values = {"secrets": {"amqpUrl": "amqp://u:p@mq:5672/%2f"}}
    with FakeKube() as kube:
        installed = render_in_cluster(chart, kube, values, is_install=True)
        first = secret_data(installed)
        assert re.fullmatch(r"[0-9a-f]{64}", first["FLEET_SECRETS_KEY"])
        secret = one(installed, "Secret", "config")
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        # generated values are computed once: the pods' checksum matches the Secret they get
        import hashlib
        digest = hashlib.sha256(json.dumps(secret["data"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        assert {d["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
                for d in find(installed, "Deployment")} == {digest}
        kube.put_secret(secret)
        # upgrade (new broker URL): the key and the generated token are read back, not regenerated
        upgraded = render_in_cluster(chart, kube, {"secrets": {"amqpUrl": "amqp://u:p@mq2:5672/%2f"}},
                                     is_upgrade=True)
        second = secret_data(upgraded)
        assert second["FLEET_SECRETS_KEY"] == first["FLEET_SECRETS_KEY"]
        assert second["FLEET_API_TOKENS"] == first["FLEET_API_TOKENS"]
        assert second["FLEET_AMQP_URL"] == "amqp://u:p@mq2:5672/%2f"
        # the pods' checksum is the hash of exactly what the Secret holds
        for dep in find(upgraded, "Deployment"):
            checksum = dep["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
            import hashlib
            data = one(upgraded, "Secret", "config")["data"]
            assert checksum == hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        # a reinstall after `helm uninstall` finds the kept Secret and its key
        again = render_in_cluster(chart, kube, values, is_install=True)
        assert secret_data(again)["FLEET_SECRETS_KEY"] == first["FLEET_SECRETS_KEY"]


def test_upgrade_refuses_to_regenerate_a_lost_key(chart):
    with FakeKube() as kube:
        with helm.Config(kube_apiserver=kube.url, namespace=NAMESPACE, storage_driver="memory") as cfg:
            with pytest.raises(helm.HelmRenderError, match="FLEET_SECRETS_KEY is gone"):
                cfg.render(chart, {"secrets": {"amqpUrl": "amqp://u:p@mq:5672/%2f"}}, name=RELEASE,
                           namespace=NAMESPACE, is_upgrade=True)


def test_existing_secret_key_mapping_checksum_and_reloader(chart):
    values = {"secrets": {"existingSecret": "fleet-creds", "existingSecretKeys": {
        "FLEET_SECRETS_KEY": "secrets-key",
        "FLEET_AMQP_URL": {"name": "rabbitmq-default-user", "key": "connection_string"}}},
        "reloader": {"enabled": True}}
    with FakeKube() as kube:
        def b64(s):
            return base64.b64encode(s.encode()).decode()

        kube.put_secret({"metadata": {"name": "rabbitmq-default-user", "namespace": NAMESPACE},
                         "data": {"connection_string": b64("amqp://a:b@mq:5672/")}})
        kube.put_secret({"metadata": {"name": "fleet-creds", "namespace": NAMESPACE},
                         "data": {"secrets-key": b64(SECRETS_KEY), "FLEET_REDIS_URL": b64("redis://r:6379/0")}})
        before = render_in_cluster(chart, kube, values, is_upgrade=True)
        assert find(before, "Secret") == []
        worker = one(before, "Deployment", "worker")
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(worker)["env"] if "valueFrom" in e}
        assert refs["FLEET_AMQP_URL"] == {"name": "rabbitmq-default-user", "key": "connection_string"}
        assert refs["FLEET_SECRETS_KEY"] == {"name": "fleet-creds", "key": "secrets-key"}
        assert refs["FLEET_REDIS_URL"] == {"name": "fleet-creds", "key": "FLEET_REDIS_URL"}
        assert worker["metadata"]["annotations"]["secret.reloader.stakater.com/reload"] == \
            "fleet-creds,rabbitmq-default-user"
        # the operator rotates the broker password: the next upgrade rolls the pods
        kube.put_secret({"metadata": {"name": "rabbitmq-default-user", "namespace": NAMESPACE},
                         "data": {"connection_string": b64("amqp://a:ROTATED@mq:5672/")}})
        after = render_in_cluster(chart, kube, values, is_upgrade=True)

        def checksum(docs):
            return one(docs, "Deployment", "worker")["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]

        assert checksum(after) != checksum(before)
        assert checksum(render_in_cluster(chart, kube, values, is_upgrade=True)) == checksum(after)


# --------------------------------------------------------------------------- extension points


def test_extra_volumes_env_init_containers_and_startup_probe(chart):
    docs = render(chart, {
        "extraEnv": [{"name": "SHARED", "value": "1"}],
        "extraEnvFrom": [{"secretRef": {"name": "shared-env"}}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        "worker": {"extraEnv": [{"name": "OWN", "valueFrom": {"secretKeyRef": {"name": "x", "key": "y"}}}],
                   "extraEnvFrom": [{"configMapRef": {"name": "worker-env"}}],
                   "extraVolumes": [{"name": "cache", "emptyDir": {}}],
                   "extraVolumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                   "initContainers": [{"name": "wait", "image": "busybox", "command": ["true"]}],
                   "startupProbe": {"enabled": True, "failureThreshold": 60}},
    })
    w = one(docs, "Deployment", "worker")
    c = container(w)
    names = [e["name"] for e in c["env"]]
    assert names.index("SHARED") < names.index("OWN")
    assert c["envFrom"][1:] == [{"secretRef": {"name": "shared-env"}}, {"configMapRef": {"name": "worker-env"}}]
    assert [m["name"] for m in c["volumeMounts"]] == ["tmp", "ca", "cache"]
    assert [v["name"] for v in w["spec"]["template"]["spec"]["volumes"]] == ["tmp", "ca", "cache"]
    assert w["spec"]["template"]["spec"]["initContainers"][0]["name"] == "wait"
    assert c["startupProbe"] == {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 0,
                                 "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 60}
    d = container(one(docs, "Deployment", "dispatcher"))
    assert "startupProbe" not in d and "OWN" not in [e["name"] for e in d["env"]]
    assert [m["name"] for m in d["volumeMounts"]] == ["tmp", "ca"]
    for doc in docs:
        kubernetes_validate.validate(strip(doc), KUBE_VERSION, strict=True)


def test_global_image_registry_and_common_annotations(chart, full_values):
    docs = render(chart, deep_merge(full_values, {
        "global": {"imageRegistry": "mirror.example.com", "imagePullSecrets": [{"name": "mirror"}]},
        "commonAnnotations": {"example.com/owner": "agents"}}))
    for dep in find(docs, "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        assert container(dep)["image"] == "mirror.example.com/registry.example.com/agent-fleet:0.1.0"
        assert spec["imagePullSecrets"] == [{"name": "mirror"}, {"name": "regcred"}]
    assert one(docs, "Pod", "test")["spec"]["containers"][0]["image"] == "mirror.example.com/curlimages/curl:8.11.1"
    for d in docs:
        assert d["metadata"]["annotations"]["example.com/owner"] == "agents", d["metadata"]["name"]
    assert one(docs, "Pod", "test")["metadata"]["annotations"]["helm.sh/hook"] == "test"
    image = container(one(render(chart, {"image": {"registry": "own.example.com"}}), "Deployment", "worker"))["image"]
    assert image == "own.example.com/agent-fleet:0.1.0"


def test_as_a_dependency_of_a_parent_chart(tmp_path):
    """helm/tests/parent-chart depends on this chart by file:// path; its `global` and the
    dependency condition's `enabled` pass the values schema."""
    import shutil

    parent = tmp_path / "parent"
    shutil.copytree(TESTS_DIR / "parent-chart", parent)
    chart_yaml = (parent / "Chart.yaml").read_text().replace("file://../../agent-fleet", f"file://{CHART_DIR}")
    (parent / "Chart.yaml").write_text(chart_yaml)
    helm.dependency_update(parent)
    with helm.Chart.load(parent) as p:
        docs = parse_manifests(p.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True))
        for dep in find(docs, "Deployment"):
            assert container(dep)["image"] == "registry.platform.example/agent-fleet:0.1.0"
            assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "platform-pull"}]
        assert {d["metadata"]["name"] for d in find(docs, "ConfigMap")} >= {f"{RELEASE}-platform"}
        # the condition switches it off
        off = parse_manifests(p.render({"agent-fleet": {"enabled": False}}, name=RELEASE, namespace=NAMESPACE))
        assert find(off, "Deployment") == []


# --------------------------------------------------------------------------- alert rules follow the values


def rule_docs(chart, values: dict) -> list[dict]:
    return [r for g in one(render(chart, deep_merge({"prometheusRule": {"enabled": True}}, values)),
                             "PrometheusRule", "monitoring")["spec"]["groups"] for r in g["rules"]]


def test_alert_rules_select_this_release_only(chart):
    rules = rule_docs(chart, {"config": {"topologyPrefix": "acme.prod"}})
    jobs = f'job=~"{RELEASE}-agent-fleet-dispatcher|{RELEASE}-agent-fleet-worker",namespace="{NAMESPACE}"'
    selector = re.compile(r'(?<![A-Za-z0-9_:])(fleet_[A-Za-z0-9_]+|up)(\{[^}]*\})?(?![A-Za-z0-9_(])')
    for r in rules:
        for m in selector.finditer(r["expr"]):
            sel = m.group(2) or ""
            assert f'namespace="{NAMESPACE}"' in sel and f'job=~"{RELEASE}-agent-fleet-' in sel or \
                f'job="{RELEASE}-agent-fleet-worker"' in sel, f"{r['alert']}: {m.group(0)}"
            assert "fleet[.]" not in sel
    no_consumers = next(r for r in rules if r["alert"] == "FleetNoConsumersWithBacklog")
    assert 'queue=~"acme[.]prod[.]work[.].*"' in no_consumers["expr"] and jobs in no_consumers["expr"]


def test_alert_rules_enable_thresholds_for_and_runbook_url(chart):
    rules = rule_docs(chart, {"prometheusRule": {
        "runbookBaseUrl": "https://wiki.example.com/runbooks#",
        "additionalRuleLabels": {"team": "agents"},
        "rules": {"FleetRedisErrors": {"enabled": False},
                  "FleetErrorRatioHigh": {"threshold": 0.2, "for": "30m"},
                  "FleetOldestJobAgeHigh": {"threshold": 600, "runbookUrl": "https://x.example.com/old"}}}})
    by_name = {r["alert"]: r for r in rules}
    assert "FleetRedisErrors" not in by_name
    assert by_name["FleetErrorRatioHigh"]["expr"].rstrip().endswith(") > 0.2")
    assert by_name["FleetErrorRatioHigh"]["for"] == "30m"
    assert ") > 600" in by_name["FleetOldestJobAgeHigh"]["expr"] and "> 120" not in by_name["FleetOldestJobAgeHigh"]["expr"]
    assert by_name["FleetOldestJobAgeHigh"]["annotations"]["runbook_url"] == "https://x.example.com/old"
    assert by_name["FleetWorkerDown"]["annotations"]["runbook_url"] == "https://wiki.example.com/runbooks#fleetworkerdown"
    assert all(r["labels"]["team"] == "agents" and r["labels"]["severity"] for r in rules)
    # the rewritten rules are still valid Prometheus rules
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make check-monitoring installs it)")
    path = TESTS_DIR / ".rendered-rules.yml"
    try:
        path.write_text(yaml.safe_dump({"groups": [{"name": "rendered", "rules": rules}]}))
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        path.unlink(missing_ok=True)
