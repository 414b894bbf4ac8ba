"""Batch-1 decode step of the model under each `--quantization` mode, same GGUF, same threads, same run.

    .venv/bin/python -m bench.experiments.quantized_decode --modes none,auto --threads 1 --context 256 --steps 64

Each mode's model decodes one token at a time after the same prompt; rounds of 8 steps alternate between the
modes so that load from other work falls on all alike. Reports median and p90 wall time per step, median CPU
time per step (all threads), and the process's resident memory after loading every mode.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from backend.loading.loader import load_model
from backend.loading.model_cache import resolve
from bench.experiments.model_decode import OurDecoder, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="none,auto")
    parser.add_argument("--context", type=int, default=256, help="prompt length before decoding")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per mode, in rounds of 8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve(args.model)
    prompt = [int(t) for t in torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0))]
    modes = args.modes.split(",")
    decoders = {m: OurDecoder(load_model(path, quantization=m).model, prompt, args.context + args.steps + 16) for m in modes}
    results: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
    tokens = dict.fromkeys(modes, 1)
    for _ in range(max(1, args.steps // 8)):
        for mode, decoder in decoders.items():
            wall, cpu, tokens[mode] = timed(decoder, tokens[mode], 8)
            results[mode][0].extend(wall)
            results[mode][1].extend(cpu)
    print(f"batch-1 decode, context {args.context}, {args.threads} threads, {args.steps} steps each")
    print(f"{'mode':<8}{'median ms':>10}{'p90 ms':>10}{'cpu ms':>10}")
    for mode, (wall, cpu) in results.items():
        p90 = statistics.quantiles(wall, n=10)[-1]
        print(f"{mode:<8}{1000 * statistics.median(wall):>10.1f}{1000 * p90:>10.1f}{1000 * statistics.median(cpu):>10.1f}")


if __name__ == "__main__":
    main()
