"""Matrices kept in the GGUF file's K-quant super-blocks (Q4_K, Q5_K, Q6_K), multiplied by the C++ kernel.

A super-block is 256 values of one row. Q4_K (144 bytes) and Q5_K (176): a float16 scale d and minimum scale
dmin, eight 32-value blocks each with a 6-bit scale and a 6-bit minimum, and 4- (5-) bit quants:
`w = d * scale * q - dmin * minimum`. Q6_K (210): a float16 d, sixteen 16-value blocks each with an int8 scale,
and 6-bit quants: `w = d * scale * (q - 32)`.

At load `repack` splits every field out of the file's bit packing and lays the output rows 8 at a time into the
kernel's layout (csrc/k_blocks.h): per super-block and group of rows the float16 scales, then per 32-value block
the low 4 bits of its quants arranged so that one 32-byte load is 4 consecutive values of each of the 8 rows,
the 5th (6th) bits beside them, and the block's scales. Nothing is requantized: every quant, scale and minimum is
the file's, so `dequantize` gives back the file's float32 values bit for bit, in 4.625 / 5.625 / 6.5625 bits a
weight: the file's 4.5 / 5.5 / 6.5625, plus (Q4_K, Q5_K) the 6-bit scales and minimums, packed 16 in 12 bytes
by the file, held as whole bytes.

The products (csrc/k_blocks.cpp) run in integers for any number of rows, on AVX-512 (VNNI), AVX2 or portable
code: integer dot products of the weights' own integers with the activations quantized per 32 values, to 16 bits
for decode rows (`DECODE_ACTIVATIONS`, as the 32-value kinds; run as two int8 rows, the high and the low bytes)
and to 8 bits for more rows (prefill), as llama.cpp multiplies K-quants.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from backend.executor.cpu.block_linear import ACTIVATION_BITS, DECODE_ACTIVATIONS, BlockWeight
from backend.executor.cpu.quant_blocks import BLOCK_BYTES, K_KINDS, SUPER, BlockQuantized

GROUP = 8  # output rows interleaved together (csrc/k_blocks.h)
# Values repacked at a time: unpacking widens each value to 12-17 bytes of temporaries, which for a whole 128k-token
# Q6_K embedding reached 4.3 GiB above the model; groups of rows are independent, so slices give the same bytes.
CHUNK_VALUES = 1 << 22
_NO_SCALES = torch.empty((0, 0), dtype=torch.float16)  # the repacked bytes hold the scales: BlockWeight's slot unused


def fields(weight: BlockQuantized) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor,
                                            torch.Tensor | None]:
    """The file's fields, unpacked: `(q, d, dmin, scales, minimums)`: quants uint8 `[rows, supers, 256]` (0..15,
    0..31 or 0..63, in value order), d and (Q4_K, Q5_K) dmin float16 `[rows, supers]`, and the block scales
    (uint8 `[rows, supers, 8]`; Q6_K int8 `[rows, supers, 16]`) and (Q4_K, Q5_K) minimums uint8 `[rows, supers, 8]`."""
    assert weight.kind in K_KINDS, weight.kind
    rows, cols = weight.shape
    b = weight.blocks.view(rows, cols // SUPER, BLOCK_BYTES[weight.kind])
    if weight.kind == "Q6_K":
        ql, qh = b[..., 0:128].reshape(rows, -1, 2, 64), b[..., 128:192].reshape(rows, -1, 2, 32)
        low = torch.stack([ql & 15, ql >> 4], dim=-2).reshape(rows, -1, SUPER)
        high = torch.stack([(qh >> (2 * i)) & 3 for i in range(4)], dim=-2).reshape(rows, -1, SUPER)
        scales = b[..., 192:208].contiguous().view(torch.int8)
        d = b[..., 208:210].contiguous().view(torch.float16).squeeze(-1)
        return low | (high << 4), d, None, scales, None
    d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    dmin = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
    packed = b[..., 4:16].reshape(rows, -1, 3, 4)
    sd, sm, both = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    scales = torch.cat([sd & 63, (both & 15) | ((sd >> 2) & 0x30)], dim=-1)
    minimums = torch.cat([sm & 63, (both >> 4) | ((sm >> 2) & 0x30)], dim=-1)
    start = 16 if weight.kind == "Q4_K" else 48
    qs = b[..., start : start + 128].reshape(rows, -1, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=-2).reshape(rows, -1, SUPER)
    if weight.kind == "Q5_K":
        qh = b[..., 16:48].reshape(rows, -1, 1, 32)
        q = q | (torch.cat([(qh >> i) & 1 for i in range(8)], dim=-2).reshape(rows, -1, SUPER) << 4)
    return q, d, dmin, scales, minimums


def _by_groups(t: torch.Tensor, groups: int) -> torch.Tensor:
    """`[rows, ...]` padded with zero rows to `groups * 8` and viewed `[groups, 8, ...]`."""
    padded = torch.zeros((groups * GROUP, *t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    return padded.view(groups, GROUP, *t.shape[1:])


def _bits(high: torch.Tensor, width: int) -> torch.Tensor:
    """The high bits (`width` of them) of a block's values `[..., half, t, j]` (value 16 half + 4 t + j) packed as
    csrc/k_blocks.h says: one byte per (row, j) with the 4 slices t of both halves (Q5_K), or one byte per
    (half, row, j) with the 4 slices (Q6_K)."""
    t = torch.arange(4).view(4, 1)
    if width == 1:
        shifts = (torch.arange(2).view(2, 1, 1) * 4 + t).to(torch.int32)
        return (high.int() << shifts).sum(dim=(-3, -2))
    return (high.int() << (2 * t).to(torch.int32)).sum(dim=-2)


def repack(weight: BlockQuantized, allocate: Callable[[list[int]], torch.Tensor] | None = None) -> torch.Tensor:
    """The kernel's bytes `[groups, supers * super-block bytes]` (csrc/k_blocks.h), the file's values moved only;
    written into `allocate(shape)` (uint8) when given, e.g. memory on huge pages."""
    rows, cols = weight.shape
    step = max(GROUP, CHUNK_VALUES // cols // GROUP * GROUP)
    if rows <= step and allocate is None:
        return _repack(weight)
    out: torch.Tensor | None = None
    for start in range(0, rows, step):
        part = BlockQuantized(weight.kind, weight.blocks[start : start + step], (min(step, rows - start), cols))
        packed = _repack(part)
        if out is None:
            shape = [-(-rows // GROUP), packed.shape[1]]
            out = torch.empty(shape, dtype=packed.dtype) if allocate is None else allocate(shape)
        out[start // GROUP : start // GROUP + packed.shape[0]] = packed
    assert out is not None
    return out


def _repack(weight: BlockQuantized) -> torch.Tensor:
    q, d, dmin, scales, minimums = fields(weight)
    rows, cols = weight.shape
    groups, supers = -(-rows // GROUP), cols // SUPER
    # [group, row, super, block, half, slice t, value j]: value 16 half + 4 t + j of the block
    values = _by_groups(q, groups).view(groups, GROUP, supers, 8, 2, 4, 4)
    nibbles = (values[..., 0, :, :] & 15) | ((values[..., 1, :, :] & 15) << 4)  # [g, r, s, b, t, j]
    parts = [nibbles.permute(0, 2, 3, 4, 1, 5).reshape(groups, supers, 8, 128)]
    if weight.kind == "Q5_K":
        bits = _bits((values >> 4) & 1, 1)  # [g, r, s, b, j]
        parts.append(bits.permute(0, 2, 3, 1, 4).reshape(groups, supers, 8, 32).to(torch.uint8))
    elif weight.kind == "Q6_K":
        bits = _bits((values >> 4) & 3, 2)  # [g, r, s, b, half, j]
        parts.append(bits.permute(0, 2, 3, 4, 1, 5).reshape(groups, supers, 8, 64).to(torch.uint8))
    if weight.kind == "Q6_K":  # [g, r, s, b, half] -> per block: the 8 rows' scale of values 0-15, then 16-31
        per_half = _by_groups(scales, groups).view(groups, GROUP, supers, 8, 2).permute(0, 2, 3, 4, 1)
        parts.append(per_half.reshape(groups, supers, 8, 16).view(torch.uint8))
        header = [_by_groups(d, groups).permute(0, 2, 1)]
    else:
        assert dmin is not None and minimums is not None
        parts += [_by_groups(t, groups).permute(0, 2, 3, 1) for t in (scales, minimums)]
        header = [_by_groups(d, groups).permute(0, 2, 1), _by_groups(dmin, groups).permute(0, 2, 1)]
    blocks = torch.cat([p.contiguous() for p in parts], dim=-1).reshape(groups, supers, -1)
    head = torch.cat([h.contiguous().view(torch.uint8) for h in header], dim=-1)
    return torch.cat([head, blocks], dim=-1).reshape(groups, -1).contiguous()


def from_k_blocks(weight: BlockQuantized, kernel: ModuleType, decode_activations: str = DECODE_ACTIVATIONS
                  ) -> BlockWeight:
    """The matrix for the kernel: its repacked bytes in `quants` (the block product dispatches on the kind).
    `decode_activations` "int8" multiplies decode rows as llama.cpp does; "int16" (or "float32", which K-quants
    have no exact path for) runs each decode row as two int8 rows, its 16 bits' high and low bytes."""
    assert decode_activations in ACTIVATION_BITS, decode_activations
    # On 2 MB pages: a decode step streams each weight once (csrc/k_blocks.cpp, huge_page_zeros).
    quants = repack(weight, kernel.huge_page_zeros)
    return BlockWeight(weight.kind, quants, _NO_SCALES, None, weight.shape, kernel, decode_activations)
