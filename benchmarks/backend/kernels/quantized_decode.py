"""Batch-1 decode step of the model under each `--quantization` mode, same GGUF, same threads, same run.

    .venv/bin/python -m benchmarks.backend.kernels.quantized_decode --modes none,auto --threads 1 --context 256 --steps 64

Each mode's model decodes one token at a time after the same prompt; rounds of 8 steps alternate between the
modes so that load from other work falls on all alike. Reports median and p90 wall time per step and median
CPU time per step (all threads). Modes are bench.perplexity's: `--modes auto:float32,auto:int16,auto:int8`
compares the block kernel's decode paths in one process.

    .venv/bin/python -m benchmarks.backend.kernels.quantized_decode --products --rows 1,2,4,8 --threads 1,2 [--head] [--cpu]

times only the matrix products of one step instead: the four matrices of each of the 30 layers of
SmolLM2-135M's shapes (distinct Q4_1 weights per layer; with `--head` also its 49152 x 576 Q8_0 vocabulary
head), in each form: float32 through oneDNN, torch's int4 pack (bfloat16 activations), the block kernel with
float32 activations (`exact`), the block kernel with activations quantized to 16 or 8 bits for integer dot
products (`int16`, `int8`: 1 to 8 rows; more rows take the exact path), and dequantize + GEMM; the last columns
are the exact kernel's time over each integer one's.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from backend.executor.cpu import block_kernel, cpu_linear
from backend.executor.cpu.block_linear import ACTIVATION_BITS, KINDS, BlockWeight, from_blocks
from backend.executor.cpu.quant_blocks import BlockQuantized
from backend.executor.model.quantized_linear import quantize_int4
from backend.loading.model_cache import resolve
from bench.perplexity import load_mode
from benchmarks.backend.model_decode import OurDecoder, timed

_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o, gate_up, down of SmolLM2-135M
_HEAD = (49152, 576)  # SmolLM2-135M's tied vocabulary, Q8_0 in the default file
_LAYERS = 30


def _packed_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return cpu_linear.linear(x, packed)


def _kernel_product(x: torch.Tensor, weight: BlockWeight, activations: str) -> torch.Tensor:
    bits, kind = ACTIVATION_BITS[activations], KINDS[weight.kind]
    out: torch.Tensor = weight.kernel.linear(x, weight.quants, weight.scales, weight.mins, kind, bits, weight.shape[0])
    return out


def _dequantized_product(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """Dequantize the whole matrix and call oneDNN: what the kernel's GEMM path must not lose to."""
    product = cpu_linear.linear if cpu_linear.available() else F.linear
    return product(x, weight.dequantize())


def _forms(head: bool) -> tuple[list[tuple[int, int]], dict[str, list[Callable[[torch.Tensor], torch.Tensor]]]]:
    """The step's matrix shapes, and one product per matrix in each form."""
    kernel = block_kernel.load()
    forms: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {"float32": [], "int4pack": []}
    if kernel is not None:
        forms |= {"exact": [], "int16": [], "int8": [], "dequant+gemm": []}
    shapes = [(shape, "Q4_1") for _ in range(_LAYERS) for shape in _SHAPES] + ([(_HEAD, "Q8_0")] if head else [])
    gen = torch.Generator().manual_seed(0)
    for (out, inp), kind in shapes:
        w = torch.randn(out, inp, generator=gen) * 0.05
        raw = quantize(w.numpy(), GGMLQuantizationType[kind])
        blocks = BlockQuantized(kind, torch.from_numpy(raw), (out, inp))
        packed = cpu_linear.pack(blocks.dequantize())
        forms["float32"].append(functools.partial(_packed_product, packed=packed))
        forms["int4pack"].append(quantize_int4(blocks).linear)
        if kernel is not None:
            weight = from_blocks(blocks, kernel)
            for name, activations in (("exact", "float32"), ("int16", "int16"), ("int8", "int8")):
                forms[name].append(functools.partial(_kernel_product, weight=weight, activations=activations))
            forms["dequant+gemm"].append(functools.partial(_dequantized_product, weight=weight))
    return [shape for shape, _ in shapes], forms


def products(rows: list[int], threads: list[int], repeats: int, head: bool, cpu: bool) -> None:
    shapes, forms = _forms(head)
    clock = time.process_time if cpu else time.perf_counter
    ratios = ["int16", "int8"] if "exact" in forms else []
    print(f"{'CPU' if cpu else 'wall'} ms for all products of one step ({_LAYERS} layers, head "
          f"{'included' if head else 'excluded'}), median of {repeats}")
    print(f"{'threads':>7}{'rows':>6}" + "".join(f"{name:>14}" for name in forms)
          + "".join(f"{'exact/' + name:>13}" for name in ratios))
    for n in threads:
        torch.set_num_threads(n)
        for r in rows:
            x = torch.randn(r, max(inp for _, inp in shapes))
            inputs = [x[:, :inp].contiguous() for _, inp in shapes]
            samples: dict[str, list[float]] = {name: [] for name in forms}
            for _ in range(repeats):  # the forms interleaved, so that load from other work falls on all alike
                for name, products in forms.items():
                    started = clock()
                    for product, rows_in in zip(products, inputs, strict=True):
                        product(rows_in)
                    samples[name].append(clock() - started)
            timings = {name: 1000 * statistics.median(times) for name, times in samples.items()}
            line = f"{n:>7}{r:>6}" + "".join(f"{t:>14.1f}" for t in timings.values())
            print(line + "".join(f"{timings['exact'] / timings[name]:>13.2f}" for name in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", action="store_true", help="time the matrix products alone")
    parser.add_argument("--rows", default="1,8,32,128", help="with --products: activation rows")
    parser.add_argument("--repeats", type=int, default=5, help="with --products: timed steps per cell")
    parser.add_argument("--head", action="store_true", help="with --products: include the vocabulary head")
    parser.add_argument("--cpu", action="store_true",
                        help="with --products: process CPU time (steadier on a shared machine) instead of wall time")
    parser.add_argument("--modes", default="none,auto")
    parser.add_argument("--context", type=int, default=256, help="prompt length before decoding")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per mode, in rounds of 8")
    parser.add_argument("--threads", default="1", help="a thread count (with --products: a list)")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    threads = [int(n) for n in args.threads.split(",")]
    if args.products:
        products([int(r) for r in args.rows.split(",")], threads, args.repeats, args.head, args.cpu)
        return
    torch.set_num_threads(threads[0])
    path = resolve(args.model)
    prompt = [int(t) for t in torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0))]
    modes = args.modes.split(",")
    decoders = {m: OurDecoder(load_mode(path, m).model, prompt, args.context + args.steps + 16) for m in modes}
    results: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
    tokens = dict.fromkeys(modes, 1)
    for _ in range(max(1, args.steps // 8)):
        for mode, decoder in decoders.items():
            wall, cpu, tokens[mode] = timed(decoder, tokens[mode], 8)
            results[mode][0].extend(wall)
            results[mode][1].extend(cpu)
    print(f"batch-1 decode, context {args.context}, {threads[0]} threads, {args.steps} steps each")
    print(f"{'mode':<14}{'median ms':>10}{'p90 ms':>10}{'cpu ms':>10}")
    for mode, (wall, cpu) in results.items():
        p90 = statistics.quantiles(wall, n=10)[-1]
        print(f"{mode:<14}{1000 * statistics.median(wall):>10.1f}{1000 * p90:>10.1f}{1000 * statistics.median(cpu):>10.1f}")


if __name__ == "__main__":
    main()
