"""`load_model`'s peak resident memory and time, A/B: two git trees loading one GGUF file, fresh processes, runs
interleaved.

    git archive main | tar -x -C /tmp/base
    python -m benchmarks.backend.load_memory --base /tmp/base --model FILE [--rounds 2] [--quantization auto]

Run it from the head tree's root. Each run is a new interpreter in that tree, which loads the block kernel, then
the model (`device="cpu"`, float32), and reports the process's VmHWM (its high-water mark: the load's peak, the
file's pages included where they are mapped), its VmRSS once loaded, and the load's wall and CPU seconds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.backend.memory import tree_arguments

_CHILD = """
import json, sys, time
from pathlib import Path
import torch
from backend.executor.cpu import block_kernel
from backend.loading.loader import load_model

def status(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
    return int(line.split()[1]) / 1024

block_kernel.load()
torch.set_num_threads(int(sys.argv[3]))
wall, cpu = time.perf_counter(), time.process_time()
load_model(Path(sys.argv[1]), device="cpu", dtype=torch.float32, quantization=sys.argv[2])
print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  "hwm_mib": status("VmHWM"), "rss_mib": status("VmRSS")}))
"""


def measure(tree: Path, model: Path, quantization: str, threads: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model), quantization, str(threads)], cwd=tree, env=env,
                          check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = tree_arguments(__doc__.split("\n")[0], "GGUF file (or HF folder) both trees load")
    parser.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "int4"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    model = args.model.expanduser().resolve()
    for round_ in range(args.rounds):
        for name, tree in (("base", args.base), ("head", args.head)):
            run = measure(tree.resolve(), model, args.quantization, args.threads)
            runs[name].append(run)
            print(f"round {round_} {name}: VmHWM {run['hwm_mib']:.0f} MiB, RSS loaded {run['rss_mib']:.0f} MiB, "
                  f"{run['wall_s']:.1f} s wall, {run['cpu_s']:.1f} s CPU (load average {os.getloadavg()[0]:.1f})",
                  flush=True)
    for name, done in runs.items():
        median = {key: statistics.median(r[key] for r in done) for key in done[0]}
        print(f"{name} median: VmHWM {median['hwm_mib']:.0f} MiB, RSS loaded {median['rss_mib']:.0f} MiB, "
              f"{median['wall_s']:.1f} s wall, {median['cpu_s']:.1f} s CPU")


if __name__ == "__main__":
    main()
