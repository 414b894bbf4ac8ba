"""A small quantizer to K-quant super-blocks (Q4_K, Q5_K, Q6_K) for the converter (gguf/writer.py) and test
data: the gguf package only dequantizes these types. It is not llama.cpp's search for the best scales (each
block's plain min/max or max-abs, its scales rounded to 6 or 8 bits against the super-block's largest), but its
bytes are the format's, so `gguf.quants.dequantize` reads them back within the rounding of the chosen levels."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

SUPER = 256
K_TYPES = frozenset({Q.Q4_K, Q.Q5_K, Q.Q6_K})


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _scales_q4k(scales: np.ndarray, minimums: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minimums `[n, 8]` in Q4_K's 12 bytes (the layout gguf's get_scale_min reads)."""
    sc, mn = scales.astype(np.uint8), minimums.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out


def _q45k(w: np.ndarray, bits: int) -> np.ndarray:
    levels = (1 << bits) - 1
    blocks = w.reshape(-1, 8, 32)
    low = np.minimum(blocks.min(-1), 0.0)
    high = blocks.max(-1)
    scale = (high - low) / levels  # per block, >= 0
    minimum = -low
    d = _f16(scale.max(-1) / 63)
    dmin = _f16(minimum.max(-1) / 63)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.clip(np.rint(scale / df[:, None]), 0, 63), 0)
        mn = np.where(dminf[:, None] > 0, np.clip(np.rint(minimum / dminf[:, None]), 0, 63), 0)
        step = (df[:, None] * sc)[..., None]
        q = np.where(step > 0, np.rint((blocks + (dminf[:, None] * mn)[..., None]) / step), 0)
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, 4, 2, 32)  # [n, pair, half, 32]
    nibbles = (q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)  # a pair of blocks: 32 bytes
    head = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), _scales_q4k(sc, mn)]
    if bits == 4:
        return np.concatenate([*head, nibbles.reshape(-1, 128)], axis=1)
    high_bits = ((q.reshape(-1, 8, 32) >> 4) & 1) << np.arange(8, dtype=np.uint8)[None, :, None]
    qh = high_bits.sum(1).astype(np.uint8)  # bit i of byte l: value l of block i
    return np.concatenate([*head, qh, nibbles.reshape(-1, 128)], axis=1)


def _q6k(w: np.ndarray) -> np.ndarray:
    blocks = w.reshape(-1, 16, 16)
    at = np.abs(blocks).argmax(-1)
    signed_max = np.take_along_axis(blocks, at[..., None], -1)[..., 0]
    scale = -signed_max / 32  # the largest magnitude maps to -32, the format's widest level
    top = np.abs(scale).max(-1)
    d = _f16(top / 127)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.clip(np.rint(scale / df[:, None]), -128, 127), 0).astype(np.int8)
        step = (df[:, None] * sc)[..., None]
        q = np.where(step != 0, np.rint(blocks / step), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [n, half, quarter, 32]
    ql = (q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)  # per half: quarters 0, 1 low; 2, 3 high
    qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2).astype(np.uint8)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
                          axis=1)


def quantize_k(w: np.ndarray, qtype: Q) -> np.ndarray:
    """`w` `[rows, cols]` (cols a multiple of 256) as the rows of `qtype` super-blocks, uint8 `[rows, bytes]`."""
    rows, cols = w.shape
    assert cols % SUPER == 0, cols
    flat = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, SUPER)
    if qtype == Q.Q6_K:
        out = _q6k(flat)
    else:
        out = _q45k(flat, 4 if qtype == Q.Q4_K else 5)
    return out.reshape(rows, -1)
