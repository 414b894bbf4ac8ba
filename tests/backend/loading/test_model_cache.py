from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from backend.loading import model_cache
from backend.loading.model_cache import MODELS, ModelCacheError, pull, resolve, sha256_of


def test_model_path_fixture_is_verified(model_path: Path) -> None:
    assert model_path.name == MODELS["smollm2"].filename
    assert sha256_of(model_path) == MODELS["smollm2"].sha256


def test_pull_is_idempotent_and_downloads_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = pull("smollm2", tmp_path, quiet=True)
    mtime = first.stat().st_mtime_ns

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("a second pull must not download")

    monkeypatch.setattr(subprocess, "run", no_download)
    assert pull("smollm2", tmp_path, quiet=True) == first
    assert first.stat().st_mtime_ns == mtime


def test_corrupt_cache_is_refetched(tmp_path: Path) -> None:
    path = pull("smollm2", tmp_path, quiet=True)
    path.write_bytes(b"not a model")
    assert sha256_of(pull("smollm2", tmp_path, quiet=True)) == MODELS["smollm2"].sha256


def test_sha256_mismatch_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = model_cache.NamedModel(**{**_as_dict(MODELS["smollm2"]), "sha256": "0" * 64})
    monkeypatch.setitem(MODELS, "smollm2", bad)
    with pytest.raises(ModelCacheError, match="sha256 mismatch"):
        pull("smollm2", tmp_path, quiet=True)
    assert not list((tmp_path / "smollm2").iterdir())


def test_resolve_names_paths_and_unknowns(tmp_path: Path, model_path: Path) -> None:
    assert resolve(str(model_path)) == model_path
    with pytest.raises(ModelCacheError, match="neither a file nor a folder"):
        resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelCacheError, match="unknown model"):
        pull("no-such-model", tmp_path)


def test_cli_pull_prints_the_path(model_path: Path) -> None:
    import sys

    done = subprocess.run([sys.executable, "-m", "tidegate", "model", "pull", "smollm2"], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(model_path)


def _as_dict(spec: model_cache.NamedModel) -> dict[str, str]:
    return {name: getattr(spec, name) for name in spec.__slots__}
