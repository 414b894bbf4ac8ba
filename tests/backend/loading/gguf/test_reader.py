"""The GGUF header and tensor reader gives what `gguf.GGUFReader` gives: the same metadata values (types included)
and tensor table, and each tensor's data in the reader's dtype and shape, in either byte order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from backend.loading.gguf.reader import read_header, read_tensor
from backend.loading.gguf.weights import read_metadata
from backend.loading.k_quantizer import quantize_k

VALUES: dict[str, tuple[Any, GGUFValueType]] = {
    "t.u8": (200, GGUFValueType.UINT8), "t.i8": (-5, GGUFValueType.INT8), "t.u16": (60000, GGUFValueType.UINT16),
    "t.i16": (-3000, GGUFValueType.INT16), "t.u32": (4_000_000_000, GGUFValueType.UINT32),
    "t.i32": (-7, GGUFValueType.INT32), "t.f32": (0.1, GGUFValueType.FLOAT32), "t.u64": (2**63, GGUFValueType.UINT64),
    "t.i64": (-(2**40), GGUFValueType.INT64), "t.f64": (0.1, GGUFValueType.FLOAT64),
    "t.bool": (True, GGUFValueType.BOOL), "t.str": ("Grüße ▁<0x0A>", GGUFValueType.STRING),
}
ARRAYS: dict[str, list[Any]] = {
    "t.strings": ["a", "", "日本", "▁the"], "t.ints": [3, -1, 7], "t.floats": [0.5, -1e-3],
    "t.bools": [True, False], "t.nested": [[1, 2], [3]], "t.nested_strings": [["x", "yz"], ["w"]],
}


def _write(path: Path, endianess: GGUFEndian) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.normal(size=(3, 5)).astype(np.float32),
        "f16": rng.normal(size=(2, 64)).astype(np.float16),
        "q8_0": rng.normal(size=(4, 64)).astype(np.float32),
        "q4_k": rng.normal(size=(2, 256)).astype(np.float32),
    }
    writer = GGUFWriter(str(path), "llama", endianess=endianess)
    writer.add_custom_alignment(64)
    for key, (value, kind) in VALUES.items():
        writer.add_key_value(key, value, kind)
    for key, values in ARRAYS.items():
        writer.add_array(key, values)
    for name, value in tensors.items():
        if name == "q8_0":
            writer.add_tensor(name, quantize(value, Q.Q8_0), raw_dtype=Q.Q8_0)
        elif name == "q4_k":
            writer.add_tensor(name, quantize_k(value, Q.Q4_K), raw_dtype=Q.Q4_K)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def _assert_same_as_reader(path: Path, *, every_tensor: bool = True, tensors: dict[str, np.ndarray] | None = None
                           ) -> None:
    """`tensors`: the float values written, which the file's float tensors must give back."""
    tensors = tensors or {}
    reader = GGUFReader(path)
    header = read_header(path)
    expected = read_metadata(reader)
    assert list(header.metadata) == list(expected)
    for key, value in expected.items():
        assert header.metadata[key] == value and type(header.metadata[key]) is type(value), key
    assert len(header.tensors) == len(reader.tensors)
    with path.open("rb", buffering=0) as file:
        for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
            assert (ours.name, ours.tensor_type, ours.shape, ours.n_elements, ours.n_bytes, ours.data_offset) == (
                theirs.name, theirs.tensor_type, tuple(theirs.shape.tolist()), theirs.n_elements, theirs.n_bytes,
                theirs.data_offset)
            if every_tensor or ours.n_bytes < 1 << 20:
                data = read_tensor(file, header, ours)
                assert data.dtype == theirs.data.dtype and data.shape == theirs.data.shape, ours.name
                assert np.array_equal(data, theirs.data) and data.flags.writeable, ours.name
                if ours.name in tensors:
                    assert np.array_equal(data, tensors[ours.name]), ours.name


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_every_value_type_and_tensor_reads_as_the_reader_reads_it(tmp_path: Path, endianess: GGUFEndian) -> None:
    path = tmp_path / "all.gguf"
    written = _write(path, endianess)
    _assert_same_as_reader(path, tensors={name: written[name] for name in ("f32", "f16")})
    assert read_header(path).metadata["t.nested_strings"] == ["x", "yz", "w"]  # flattened, as the reader does


def test_a_real_vocabulary_reads_as_the_reader_reads_it(model_path: Path) -> None:
    _assert_same_as_reader(model_path, every_tensor=False)


def test_not_a_gguf_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="magic"):
        read_header(path)


def test_a_tensor_past_the_end_of_the_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    _write(path, GGUFEndian.LITTLE)
    header = read_header(path)
    path.write_bytes(path.read_bytes()[: header.tensors[-1].data_offset + 10])
    with path.open("rb", buffering=0) as file, pytest.raises(ValueError, match="past the end"):
        read_tensor(file, header, header.tensors[-1])

