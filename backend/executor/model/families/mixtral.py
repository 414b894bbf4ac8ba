"""Mixtral: the Llama layer (llama.cpp's files are llama-arch, Q/K rows permuted) with routed experts for its MLP
(moe.py), the chosen experts' weights always renormalized.

Checkpoints name the experts `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up) and `w2` (down); llama.cpp's
files stack them per kind (`ffn_gate_exps`), or, written before it did, keep one tensor per expert
(`ffn_gate.{e}.weight`).
"""

from __future__ import annotations

import re
from typing import ClassVar

from backend.executor.model.families import moe
from backend.executor.model.model import LlamaModel


class MixtralModel(LlamaModel):
    LAYER = moe.RoutedLayer
    HF_NAMES = (
        (re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight$"), r"layers.\1.router"),
        (re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w1\.weight$"), r"layers.\1.experts.\2.gate"),
        (re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w3\.weight$"), r"layers.\1.experts.\2.up"),
        (re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w2\.weight$"), r"layers.\1.experts.\2.down"),
        *moe.HF_NAMES,
    )
    GGUF_NAMES: ClassVar[dict[str, str]] = {
        **moe.GGUF_NAMES,
        **{f"ffn_{kind}.{{expert}}.weight": f"mlp.experts.{{expert}}.{kind}_proj.weight" for kind in ("gate", "up", "down")},
    }
