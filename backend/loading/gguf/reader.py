"""A GGUF file's header (metadata and tensor table) and its tensors' bytes, read without `gguf.GGUFReader`.

The package's reader builds numpy views and Python objects for every element of every array field, each of a
128k-token vocabulary's strings among them: for Llama 3's file that took 6-9 s and ~300 MiB that lived through
the load, and its tensors are views of a memory map, whose pages, once copied from, stay resident beside the
copies (both count in the process's peak). Here an array is one `numpy.frombuffer` (strings: one slice each),
and each tensor is read with `readinto` into memory of its own, so the page cache holds the file, not the process.
The values are the reader's: `ReaderField.contents()` for metadata (tests hold the two equal), the dtype and
shape of `ReaderTensor.data` for tensors.
"""

from __future__ import annotations

import io
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS
from gguf.quants import quant_shape_to_byte_shape

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "u1", GGUFValueType.INT8: "i1", GGUFValueType.UINT16: "u2", GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4", GGUFValueType.INT32: "i4", GGUFValueType.FLOAT32: "f4", GGUFValueType.UINT64: "u8",
    GGUFValueType.INT64: "i8", GGUFValueType.FLOAT64: "f8", GGUFValueType.BOOL: "?",
}
# Tensor types the reader gives as typed elements; every other type comes as its bytes.
_ELEMENTS = {
    GGMLQuantizationType.F16: "f2", GGMLQuantizationType.F32: "f4", GGMLQuantizationType.F64: "f8",
    GGMLQuantizationType.I8: "i1", GGMLQuantizationType.I16: "i2", GGMLQuantizationType.I32: "i4",
    GGMLQuantizationType.I64: "i8",
}


ByteOrder = Literal["<", ">"]


@dataclass(slots=True, frozen=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # as the file lists the dims: fastest first
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file


@dataclass(slots=True)
class GGUFHeader:
    metadata: dict[str, Any]  # every key/value but the reader's own `GGUF.*` ones
    tensors: list[TensorInfo]
    byte_order: ByteOrder


class _Cursor:
    """Reads values of one byte order from a buffer, moving forward."""

    def __init__(self, buffer: mmap.mmap, order: ByteOrder) -> None:
        self.buffer, self.order, self.at = buffer, order, 0

    def unpack(self, code: str) -> Any:
        (value,) = struct.unpack_from(self.order + code, self.buffer, self.at)
        self.at += struct.calcsize(code)
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        self.at += length
        return str(self.buffer[self.at - length : self.at], encoding="utf-8")

    def array(self, dtype: str, count: int) -> np.ndarray:
        values = np.frombuffer(self.buffer, dtype=np.dtype(dtype).newbyteorder(self.order), count=count, offset=self.at)
        self.at += values.nbytes
        return values

    def value(self, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind in _SCALARS:
            return self.array(_SCALARS[kind], 1).tolist()[0]
        if kind == GGUFValueType.ARRAY:
            return self.items(GGUFValueType(self.unpack("I")), self.unpack("Q"))
        raise ValueError(f"unknown GGUF value type {kind}")

    def items(self, kind: GGUFValueType, count: int) -> list[Any]:
        """An array's elements; nested arrays flattened into one list, as the reader's `contents()` gives them."""
        if kind in _SCALARS:
            return self.array(_SCALARS[kind], count).tolist()
        if kind == GGUFValueType.STRING:
            return [self.string() for _ in range(count)]
        out: list[Any] = []
        for _ in range(count):
            nested = self.value(kind)
            out += nested if isinstance(nested, list) else [nested]
        return out


def read_header(path: Path) -> GGUFHeader:
    """The metadata and the tensor table; fails as the reader does on a file that is not GGUF (ValueError)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        if struct.unpack_from("<I", buffer, 0)[0] != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        # A version whose low half is zero was written in the other byte order (the reader's own test).
        order: ByteOrder = ">" if struct.unpack_from("<I", buffer, 4)[0] & 0xFFFF == 0 else "<"
        cursor = _Cursor(buffer, order)
        cursor.at = 4
        version = cursor.unpack("I")
        if version not in READER_SUPPORTED_VERSIONS:
            raise ValueError(f"Sorry, file appears to be version {version} which we cannot handle")
        tensor_count, kv_count = cursor.unpack("Q"), cursor.unpack("Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            kind = GGUFValueType(cursor.unpack("I"))
            if key in metadata:
                raise KeyError(f"Duplicate {key} already in list")
            if key == "general.alignment" and kind != GGUFValueType.UINT32:
                raise ValueError("Bad type for general.alignment field")
            metadata[key] = cursor.value(kind)
        tables = [_tensor_entry(cursor) for _ in range(tensor_count)]
        alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if alignment == 0 or alignment & (alignment - 1):
            raise ValueError("Invalid alignment: must be a non-zero power of two")
        start = -(-cursor.at // alignment) * alignment
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for name, dims, tensor_type, offset in tables:
        if name in names:
            raise ValueError(f"Found duplicated tensor with name {name}")
        names.add(name)
        block, type_bytes = GGML_QUANT_SIZES[tensor_type]
        elements = int(np.prod(dims))
        tensors.append(TensorInfo(name, tensor_type, dims, elements, elements * type_bytes // block, start + offset))
    return GGUFHeader(metadata, tensors, order)


def _tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cursor.string()
    dims = tuple(int(n) for n in cursor.array("u8", cursor.unpack("I")))
    return name, dims, GGMLQuantizationType(cursor.unpack("I")), cursor.unpack("Q")


def read_tensor(file: io.RawIOBase, header: GGUFHeader, tensor: TensorInfo) -> np.ndarray:
    """The tensor's data, writable and owned, in the dtype and shape of the reader's `ReaderTensor.data`: typed
    elements for the float and integer types, bytes `[..., rows, row bytes]` for the block types."""
    data = np.empty(tensor.n_bytes, dtype=np.uint8)
    view = data.data
    file.seek(tensor.data_offset)
    done = 0
    while done < tensor.n_bytes:  # one read returns at most ~2 GiB on Linux
        got = file.readinto(view[done:])
        if not got:
            raise ValueError(f"tensor {tensor.name} ends past the end of the file")
        done += got
    dims = tuple(reversed(tensor.shape))
    if tensor.tensor_type in _ELEMENTS:
        return data.view(np.dtype(_ELEMENTS[tensor.tensor_type]).newbyteorder(header.byte_order)).reshape(dims)
    return data.reshape(quant_shape_to_byte_shape(dims, tensor.tensor_type))
