"""Building and loading tidegate's C++ extension for the CPU: the kernel that multiplies with GGML's blocks
(csrc/block_matmul.cpp, its GEMM path csrc/block_gemm.cpp, its integer decode path
csrc/block_integer_dot.cpp), the K-quant products (csrc/k_blocks.cpp, csrc/k_blocks_avx512.cpp), the decode attention that reads the paged KV cache in place
(csrc/paged_attention.cpp), the row-wise ops around the products (csrc/elementwise.cpp), and a decode step's
layers as one call of all of those (csrc/decode_stack.cpp).

It is compiled once per machine with torch's extension tooling (ninja and a C++ compiler) into
`~/.cache/tidegate/kernels/<torch version>-<source hash>/` (or `$TIDEGATE_KERNEL_DIR`), and loaded from there
by every later process. A build goes to a fresh temporary folder that is renamed into place when it is done,
so processes building at the same time never read a half-written library: the first rename wins, and the
others load their own complete copy. Where the build cannot happen (no compiler, no ninja, an error), `load`
warns once and returns None: quantized matrices keep torch's int4/int8 forms and attention keeps SDPA.

    python -m backend.executor.cpu.block_kernel build    # what `make setup` runs, so no server pays the build
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

NAME = "tidegate_block_matmul"
CSRC = Path(__file__).with_name("csrc")
SOURCES = [
    CSRC / name
    for name in ("block_matmul.cpp", "block_gemm.cpp", "block_integer_dot.cpp", "paged_attention.cpp", "elementwise.cpp",
                 "decode_stack.cpp", "k_blocks.cpp", "k_blocks_avx512.cpp")
]
_FLAGS = ["-O3", "-std=c++17", "-fopenmp"]  # without -fopenmp at::parallel_for runs serially
BUILD_SECONDS = 270  # eight sources, about 3.5 CPU minutes (245-450 s wall on a busy 2-core machine); the log line tells users what the first start costs


def cache_dir() -> Path:
    """Where this torch and this source's build lives."""
    root = Path(os.environ.get("TIDEGATE_KERNEL_DIR", "~/.cache/tidegate/kernels")).expanduser()
    sources = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))  # headers too: a changed one must rebuild
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in sources) + " ".join(_FLAGS).encode()).hexdigest()[:12]
    return root / f"{torch.__version__}-{digest}"


def _library(folder: Path) -> Path | None:
    found = [folder / (NAME + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return next((path for path in found if path.is_file()), None)


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(build_dir: Path) -> ModuleType:
    from torch.utils import cpp_extension  # imported late: it is slow, and only a build needs it

    _put_ninja_on_path()
    module: ModuleType = cpp_extension.load(
        name=NAME, sources=[str(s) for s in SOURCES], build_directory=str(build_dir), extra_cflags=_FLAGS,
        extra_ldflags=["-fopenmp"], verbose=False
    )
    return module


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the PyPI package's binary sits in a venv that may not be activated."""
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def _build(target: Path) -> ModuleType:
    log.warning("building the CPU kernels once, ~%d s (into %s)", BUILD_SECONDS, target)
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        module = _compile(scratch)
        with contextlib.suppress(OSError):  # another process finished first; its library is as good as ours
            scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.warning("built the CPU kernels in %.0f s", time.monotonic() - started)
    return module


def _load() -> ModuleType | None:
    target = cache_dir()
    try:
        library = _library(target)
        if library is not None:
            return _import(library)
        compiler = os.environ.get("CXX", "c++")  # the compiler torch's tooling calls
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler ({compiler}) on PATH")
        return _build(target)
    except Exception as exc:  # a missing compiler or ninja surfaces as any of several exception types
        log.warning("the CPU kernels are unavailable (%s); quantized matrices use torch's int4/int8 forms, "
                    "attention SDPA",
                    str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        return None


@functools.cache
def load() -> ModuleType | None:
    """The kernel module (`linear`, `dequantize`, `uses_avx2`, `uses_avx512_vnni`, `set_isa`), built on first
    use; None where it cannot be."""
    return _load()


def has_op(name: str) -> bool:
    """Whether the extension loads (built on first use) and registered `torch.ops.tidegate.<name>`."""
    if load() is None:
        return False
    try:
        getattr(torch.ops.tidegate, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m backend.executor.cpu.block_kernel build", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = load()
    if module is None:
        return 1
    print(f"CPU kernels ready in {cache_dir()} (AVX2 path: {module.uses_avx2()}, "
          f"AVX-512 VNNI prefill GEMM: {module.uses_avx512_vnni()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
