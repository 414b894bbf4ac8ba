"""deploy/: every manifest valid for Kubernetes; every port, probe, flag and variable one the tiers really have."""

from __future__ import annotations

import argparse
import base64
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from starlette.routing import Route

from backend.engine.records import EngineStats
from backend.server.app import BackendServer
from backend.server.metrics import BackendMetrics
from common import openapi
from config import GatewaySettings, Settings
from config.admin_key import required_admin_key
from config.backend import BackendSettings
from gateway.server import drain_seconds
from tests.deploy.conftest import DEPLOY, REDIS_PASSWORD, ROOT, VARIANTS, Manifests
from tidegate.cli import build_parser, settings_from_args

# the oldest Kubernetes minor still commonly run, and the newest the bundled schemas know
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
GATEWAY, BACKEND = "tidegate-gateway", "tidegate-backend"
DOCKERFILE = (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_manifest_is_valid_for_kubernetes(manifests: dict[str, Manifests], variant: str,
                                                         version: str) -> None:
    rendered = manifests[variant]
    for doc in rendered.docs:
        # strict: a misspelt or misplaced field fails instead of being dropped by the API server
        kubernetes_validate.validate(doc, version, strict=True)
    kinds = sorted(d["kind"] for d in rendered.docs)
    assert kinds == sorted(["Namespace", "ConfigMap", "Secret", "Secret", "Secret", "Deployment", "Deployment",
                            "StatefulSet", "Service", "Service", "Service", "PodDisruptionBudget",
                            "PodDisruptionBudget", "HorizontalPodAutoscaler", "HorizontalPodAutoscaler",
                            "NetworkPolicy"])


def test_gateway_starts_from_its_config_map_secret_and_env(manifests: dict[str, Manifests], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests["base"]
    settings = gateway_settings(rendered, tmp_path, monkeypatch)
    container = rendered.container(GATEWAY)
    assert settings.port == port_named(container, "http")
    assert settings.host == "0.0.0.0"
    assert settings.redis_url is not None, "several gateway replicas share state only through Redis"
    # the key the Secret mounts passes the gateway's admin key policy, read from where the config points
    assert required_admin_key(settings)
    assert "admin_key" in (DEPLOY / "base" / "secrets" / ".gitignore").read_text().split()


def test_redis_requires_the_secrets_password_which_the_gateway_sends_and_only_the_gateway_may_connect(
        manifests: dict[str, Manifests], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests["base"]
    settings = gateway_settings(rendered, tmp_path, monkeypatch)
    assert settings.redis_url is not None and urlsplit(settings.redis_url).password == REDIS_PASSWORD
    redis = rendered.one("StatefulSet", "tidegate-redis")["spec"]["template"]
    [container] = redis["spec"]["containers"]
    env = container_env(rendered, container)
    assert env["REDIS_PASSWORD"] == env["REDISCLI_AUTH"] == REDIS_PASSWORD
    script = " ".join(container["command"] + container["args"])
    assert "requirepass" in script and REDIS_PASSWORD not in script and "$REDIS_PASSWORD" in script
    assert "redis-cli" in str(container["readinessProbe"])  # authenticates through REDISCLI_AUTH
    [policy] = rendered.of_kind("NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= redis["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    [peer] = rule["from"]
    gateway_labels = rendered.one("Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    backend_labels = rendered.one("Deployment", BACKEND)["spec"]["template"]["metadata"]["labels"]
    assert set(peer) == {"podSelector"} and peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= backend_labels.items()
    [port] = rule["ports"]
    assert port_named(container, port["port"]) == 6379
    assert "redis_password" in (DEPLOY / "base" / "secrets" / ".gitignore").read_text().split()


def test_gateway_reaches_redis_and_the_backends_through_their_services(
        manifests: dict[str, Manifests], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests["base"]
    settings = gateway_settings(rendered, tmp_path, monkeypatch)
    assert settings.redis_url is not None
    redis = urlsplit(settings.redis_url)
    assert (redis.hostname, redis.port) == service_address(rendered, "tidegate-redis")
    backend = backend_settings(rendered)
    [channel] = settings.channels
    upstream = urlsplit(channel.base_url)
    assert (upstream.hostname, upstream.port, upstream.path) == (*service_address(rendered, BACKEND), "/v1")
    assert backend.served_model_name is None and backend.model in channel.models.values()
    # while Redis is down, rate limits are divided among as many replicas as the autoscaler may run
    hpa = rendered.one("HorizontalPodAutoscaler", GATEWAY)
    assert settings.gateway_replicas == hpa["spec"]["maxReplicas"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gateway_and_backends_share_one_token_and_metrics_need_one(
        manifests: dict[str, Manifests], variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests[variant]
    gateway = gateway_settings(rendered, tmp_path, monkeypatch)
    (tmp_path / "gateway").mkdir()
    (tmp_path / "backend").mkdir()
    gateway_files = mounted_files(rendered, GATEWAY, tmp_path / "gateway")
    backend_files = mounted_files(rendered, BACKEND, tmp_path / "backend")
    token_file = backend_settings(rendered).gateway_token_file
    [channel] = gateway.channels
    assert token_file is not None and channel.api_key_file is not None
    token = Path(backend_files[str(token_file)]).read_text()
    assert token.strip() and Path(gateway_files[str(channel.api_key_file)]).read_text() == token
    for path in (gateway.metrics_token_file, gateway.cache_salt_secret_file):
        assert path is not None and Path(gateway_files[str(path)]).read_text().strip()
    assert not gateway.metrics_public
    pod = rendered.one("Deployment", BACKEND)["spec"]["template"]["spec"]
    [tokens] = [v["secret"] for v in pod["volumes"] if "secret" in v]
    assert tokens["items"] == [{"key": "backend_token", "path": "backend_token"}]  # not the gateway's others


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_backend_channel_admits_what_the_largest_backend_fleet_can_run(
        manifests: dict[str, Manifests], variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests[variant]
    settings = gateway_settings(rendered, tmp_path, monkeypatch)
    fleet = rendered.one("HorizontalPodAutoscaler", BACKEND)["spec"]["maxReplicas"]
    assert settings.channels[0].max_concurrency >= fleet * backend_settings(rendered).max_num_seqs


@pytest.mark.parametrize("variant", VARIANTS)
def test_backend_args_are_the_real_cli_flags_and_match_the_image(manifests: dict[str, Manifests],
                                                                 variant: str) -> None:
    rendered = manifests[variant]
    settings = backend_settings(rendered)
    container = rendered.container(BACKEND)
    assert settings.port == port_named(container, "http") and settings.host == "0.0.0.0"
    assert settings.device == ("cuda" if variant == "overlays/gpu" else "cpu")
    # the named model is baked into the image: a new replica downloads nothing
    assert f"tidegate model pull {settings.model}" in DOCKERFILE
    exposed = {int(port) for line in DOCKERFILE.splitlines() if line.startswith("EXPOSE")
               for port in line.split()[1:]}
    assert {settings.port, port_named(rendered.container(GATEWAY), "http")} <= exposed
    if settings.device == "cpu":
        assert settings.threads == int(container["resources"]["requests"]["cpu"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_ask_each_tier_its_health_on_its_serving_port(manifests: dict[str, Manifests],
                                                             variant: str) -> None:
    rendered = manifests[variant]
    for name, gateway in ((GATEWAY, True), (BACKEND, False)):
        container = rendered.container(name)
        paths = openapi.document(name, gateway=gateway)["paths"]
        probes = {kind: container.get(kind) for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
        assert probes["readinessProbe"] and probes["livenessProbe"]
        for probe in filter(None, probes.values()):
            assert probe["httpGet"]["path"] == "/health" and "/health" in paths
            assert port_named(container, probe["httpGet"]["port"])
    # /health is 503 until the model is loaded and warm: the startup probe must outlast a slow load
    startup = rendered.container(BACKEND)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_grace_periods_cover_the_pre_stop_pause_and_the_whole_drain(manifests: dict[str, Manifests],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = manifests["base"]
    gateway = gateway_settings(rendered, tmp_path, monkeypatch)
    backend = backend_settings(rendered)
    assert backend.drain_timeout >= gateway.timeouts.total, "a backend cut before the gateway's deadline"
    for name, drain in ((GATEWAY, drain_seconds(gateway)), (BACKEND, backend.drain_timeout)):
        pod = rendered.one("Deployment", name)["spec"]["template"]["spec"]
        pause = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert pause[0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] >= int(pause[1]) + drain


@pytest.mark.parametrize("variant", VARIANTS)
def test_services_budgets_and_autoscalers_point_at_real_workloads(manifests: dict[str, Manifests],
                                                                  variant: str) -> None:
    rendered = manifests[variant]
    workloads = rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")

    def selected(selector: dict[str, str]) -> dict[str, Any]:
        [workload] = [w for w in workloads
                      if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        return workload

    for service in rendered.of_kind("Service"):
        [container] = selected(service["spec"]["selector"])["spec"]["template"]["spec"]["containers"]
        for port in service["spec"]["ports"]:
            assert port["port"] == port_named(container, port["targetPort"])
    for budget in rendered.of_kind("PodDisruptionBudget"):
        assert selected(budget["spec"]["selector"]["matchLabels"])["kind"] == "Deployment"
    for hpa in rendered.of_kind("HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert rendered.one(target["kind"], target["name"])
        assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], "one replica cannot drain"


def test_backend_autoscaler_reads_the_queue_depth_the_backends_export(
        manifests: dict[str, Manifests]) -> None:
    rendered = manifests["base"]
    [metric] = rendered.one("HorizontalPodAutoscaler", BACKEND)["spec"]["metrics"]
    served_as = metric["pods"]["metric"]["name"]
    rules = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    [rule] = [r for r in rules if r["name"]["as"] == served_as]
    series = rule["seriesQuery"].split("{")[0]
    assert re.fullmatch(rule["name"]["matches"], series)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}, "a Pods metric needs the pod label"
    # the series is one a real backend renders on /metrics
    stats = EngineStats(num_running=1, num_waiting=3, kv_usage=0.5, kv_blocks_total=8, kv_blocks_free=4,
                        prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0, steps=1)
    exported = BackendMetrics("smollm2", lambda: stats).render().decode()
    assert re.search(rf'^{series}\{{model_name="smollm2"\}} 3\.0$', exported, re.MULTILINE)
    # and Prometheus scrapes it from the port and path the backend serves it on
    pod = rendered.one("Deployment", BACKEND)["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port_named(pod["spec"]["containers"][0], "http")
    server = BackendServer(BackendSettings(), Path("unloaded.gguf"), "smollm2")  # loads only when served
    routes = {route.path for route in server.app.routes if isinstance(route, Route)}
    assert annotations["prometheus.io/path"] in routes
    # vLLM replicas behind the same gateway are served by their own rule under a name without a colon
    assert any(r["seriesQuery"].startswith("vllm:num_requests_waiting{") for r in rules)


def test_gpu_overlay_gives_each_backend_one_gpu_and_the_cuda_image(manifests: dict[str, Manifests]) -> None:
    gpu = manifests["overlays/gpu"]
    backend = gpu.container(BACKEND)
    assert backend["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert backend["image"] == "tidegate:cuda" and "-t tidegate:cuda" in DOCKERFILE
    assert gpu.container(GATEWAY)["image"] == manifests["base"].container(GATEWAY)["image"] == "tidegate:cpu"
    assert "nvidia.com/gpu" not in str(manifests["base"].container(BACKEND)["resources"])


def gateway_settings(rendered: Manifests, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """What the gateway container starts with: its args through the real CLI, its mounted files, its env."""
    container = rendered.container(GATEWAY)
    mounts = mounted_files(rendered, GATEWAY, tmp_path)
    env = container_env(rendered, container)
    for name, value in env.items():
        if not any(f"$({name})" in str(var.get("value")) for var in container["env"]):  # a part of another
            assert setting_of(name), f"{name} sets no setting"
            monkeypatch.setenv(name, value)
    argv = [mounts.get(arg, arg) for arg in container["command"][1:] + container["args"]]
    args = parse_exactly(argv)
    settings = settings_from_args(args, "gateway", args.setting_fields).gateway
    assert settings.admin_key_file is not None
    return settings.model_copy(update={"admin_key_file": Path(mounts[str(settings.admin_key_file)])})


def container_env(rendered: Manifests, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes gives it: Secret references read, $(NAME) references expanded."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            secret = rendered.one("Secret", ref["name"])  # the generated name, as rendered
            env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
    return env


def backend_settings(rendered: Manifests) -> BackendSettings:
    container = rendered.container(BACKEND)
    assert not container.get("env"), "backend settings are flags"
    args = parse_exactly(container["command"][1:] + container["args"])
    return settings_from_args(args, "backend", args.setting_fields).backend


def parse_exactly(argv: list[str]) -> argparse.Namespace:
    """The real CLI's parse, refusing the abbreviations argparse would accept (`--thread` for `--threads`)."""
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    flags = commands.choices[argv[0]]._option_string_actions
    assert [a for a in argv if a.startswith("--") and a not in flags] == []
    return parser.parse_args(argv)


def mounted_files(rendered: Manifests, deployment: str, tmp_path: Path) -> dict[str, str]:
    """Each file a ConfigMap or Secret volume mounts, written under tmp_path: {path in the pod: path here}."""
    pod = rendered.one("Deployment", deployment)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = rendered.one("ConfigMap", volume["configMap"]["name"])["data"]
        else:
            encoded = rendered.one("Secret", volume["secret"]["secretName"])["data"]
            data = {key: base64.b64decode(value).decode() for key, value in encoded.items()}
        for key, text in data.items():
            local = tmp_path / mount["name"] / key
            local.parent.mkdir(exist_ok=True)
            local.write_text(text)
            files[str(PurePosixPath(mount["mountPath"]) / key)] = str(local)
    return files


def setting_of(env_name: str) -> bool:
    """Whether TIDEGATE_A__B names a setting (pydantic silently ignores unknown or single-underscore names)."""
    model: type[BaseModel] = Settings
    *sections, leaf = env_name.removeprefix("TIDEGATE_").lower().split("__")
    for section in sections:
        annotation = model.model_fields[section].annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation
    return env_name.startswith("TIDEGATE_") and leaf in model.model_fields


def port_named(container: dict[str, Any], port: str | int) -> int:
    [number] = [p["containerPort"] for p in container["ports"] if port in (p["name"], p["containerPort"])]
    return int(number)


def service_address(rendered: Manifests, name: str) -> tuple[str, int]:
    [port] = rendered.one("Service", name)["spec"]["ports"]
    return name, port["port"]
