"""GGUF headers (ggml's docs/gguf.md): the metadata and tensor infos of a
llama.cpp model file, never its tensors.

A GGUF file is little-endian: the magic ``GGUF``, a uint32 version (2 and 3
are read; 1 counted in uint32 and is gone), the uint64 tensor count and
key/value count, the key/value pairs (a string key, a uint32 value type, the
value), then one info per tensor (name, uint32 dimension count, uint64
dimensions, uint32 ggml type, uint64 offset into the data), then padding to
``general.alignment`` (32 when absent) and the data.

A string is a uint64 length and that many UTF-8 bytes; an array is a uint32
element type, a uint64 length and the elements. Every count and length is
checked against the bytes left before anything is read or kept, so a
hostile file cannot make the parser allocate or loop past what the file
holds; the header as a whole stops at GGUF_HEADER_LIMIT. Arrays keep their
first ARRAY_VALUES_KEPT values (a tokenizer's vocabulary is 100,000
strings that inspect does not show).

Reading is the caller's: ``read_at(offset, size)`` returns the file's bytes
there (fewer at its end).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import InvalidCarton

from .read_at import ReadAt, read_at_bytes

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_HEADER_LIMIT = 256 << 20
"""The most bytes of metadata and tensor infos read (the largest
vocabularies take tens of MiB)."""
ARRAY_VALUES_KEPT = 16
MAX_DIMS = 4            # GGML_MAX_DIMS
MAX_TENSORS = 1 << 18
"""Tensor infos read at most (the largest published models have some
thousands): each becomes a Python object, so the header limit alone would
let a hostile file make millions of them."""
MAX_METADATA_KEYS = 1 << 16
"""Metadata keys read at most (llama.cpp's files have some dozens; a
vocabulary is one key holding an array)."""
MAX_ARRAY_NESTING = 8
MAX_NESTED_ARRAYS = 1 << 16
"""Arrays of arrays (which llama.cpp does not write) hold at most this many."""
DEFAULT_ALIGNMENT = 32
_CHUNK = 1 << 20
_U64 = struct.Struct("<Q")

_SCALARS: dict[int, tuple[str, str]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"),
    10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d"),
}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_MIN_VALUE_SIZE = {code: struct.calcsize(fmt) for code, (_, fmt) in _SCALARS.items()} | {_STRING: 8, _ARRAY: 12}

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}
"""ggml_type: a tensor's element type."""
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    33: "Q4_0_4_4", 34: "Q4_0_4_8", 35: "Q4_0_8_8", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4",
    40: "Q1_0", 1024: "GUESSED",
}
"""llama_ftype, ``general.file_type``: the quantization of the file's
weights as a whole (its 1-D tensors stay F32)."""


@dataclass(frozen=True)
class GGUFArray:
    """An array value: its element type, length and first values."""

    element_type: str
    length: int
    values: tuple[Any, ...]


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]
    """ggml's order: the fastest-varying dimension first."""
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, f"type {self.ggml_type}")


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]
    data_start: int
    """File offset of the tensor data (the header padded to the alignment)."""

    @property
    def architecture(self) -> str | None:
        return _text(self.metadata.get("general.architecture"))

    @property
    def name(self) -> str | None:
        return _text(self.metadata.get("general.name"))

    @property
    def quantization(self) -> str | None:
        """``general.file_type`` by its llama.cpp name; None when absent."""
        code = self.metadata.get("general.file_type")
        if not isinstance(code, int) or isinstance(code, bool):
            return None
        return FILE_TYPES.get(code, f"file type {code}")

    @property
    def parameter_count(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors)

    def arch_value(self, key: str) -> Any:
        """``ARCH.key`` (``context_length``, ``block_count``...) of the file's architecture."""
        return self.metadata.get(f"{self.architecture}.{key}") if self.architecture else None

    def summary(self) -> dict[str, Any]:
        """What inspect shows: the model, its quantization and size."""
        types: dict[str, int] = {}
        for t in self.tensors:
            types[t.type_name] = types.get(t.type_name, 0) + 1
        return {"version": self.version, "architecture": self.architecture, "name": self.name,
                "quantization": self.quantization, "parameters": self.parameter_count,
                "tensors": len(self.tensors), "tensor_types": dict(sorted(types.items())),
                "context_length": self.arch_value("context_length"),
                "embedding_length": self.arch_value("embedding_length"),
                "block_count": self.arch_value("block_count")}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_gguf(read_at: ReadAt, file_size: int, *, file: str) -> GGUFHeader:
    """The header of the ``file_size``-byte GGUF file ``file`` (named in
    errors), read through ``read_at``. Raises InvalidCarton naming the field
    at fault: the magic, an unread version, big-endian files, a count or
    length past the end of the file or the header limit, an unknown value
    type, a key twice, text that is not UTF-8, a tensor with too many
    dimensions or an offset off the alignment or past the file's end."""
    cursor = _Cursor(read_at, file_size, file)
    magic = cursor.take(4, "magic")
    if magic != GGUF_MAGIC:
        raise InvalidCarton(file, f"starts with {magic!r}, not the GGUF magic {GGUF_MAGIC!r}", field="magic")
    version = cursor.scalar("<I", "version")
    if version not in GGUF_VERSIONS:
        if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") in GGUF_VERSIONS:
            raise InvalidCarton(file, "is a big-endian GGUF file; only little-endian files are read", field="version")
        raise InvalidCarton(file, f"is GGUF version {version}; versions 2 and 3 are read", field="version")
    tensor_count = cursor.count("tensor_count", per_item=_TENSOR_INFO_MIN, most=MAX_TENSORS)
    kv_count = cursor.count("metadata_kv_count", per_item=8 + 4, most=MAX_METADATA_KEYS)
    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        key = cursor.string(f"metadata[{i}].key")
        if key in metadata:
            raise InvalidCarton(file, "is a key already given", field=f"metadata {key!r}")
        code = cursor.scalar("<I", f"metadata {key!r}.type")
        metadata[key] = cursor.value(code, f"metadata {key!r}", 0)
    tensors = tuple(_tensor_info(cursor, i) for i in range(tensor_count))
    alignment = _alignment(metadata.get("general.alignment", DEFAULT_ALIGNMENT), file)
    data_start = -(-cursor.offset // alignment) * alignment
    for t in tensors:
        where = f"tensor {t.name!r}.offset"
        if t.offset % alignment:
            raise InvalidCarton(file, f"{t.offset} is not a multiple of the alignment {alignment}", field=where)
        if data_start + t.offset > file_size:
            raise InvalidCarton(file, f"{t.offset} is past the end of the file ({file_size} bytes, data from "
                                f"{data_start})", field=where)
    return GGUFHeader(version, metadata, tensors, data_start)


_TENSOR_INFO_MIN = 8 + 4 + 4 + 8   # an empty name, no dimensions, type, offset


def _tensor_info(cursor: _Cursor, index: int) -> GGUFTensorInfo:
    name = cursor.string(f"tensor[{index}].name")
    where = f"tensor {name!r}"
    n_dims = cursor.scalar("<I", f"{where}.n_dimensions")
    if n_dims > MAX_DIMS:
        raise InvalidCarton(cursor.file, f"{n_dims} dimensions, over ggml's {MAX_DIMS}",
                            field=f"{where}.n_dimensions")
    shape = tuple(cursor.scalar("<Q", f"{where}.dimensions") for _ in range(n_dims))
    if math.prod(shape) >= 1 << 63:
        raise InvalidCarton(cursor.file, f"{list(shape)} holds more elements than ggml counts (2**63)",
                            field=f"{where}.dimensions")
    ggml_type = cursor.scalar("<I", f"{where}.type")
    offset = cursor.scalar("<Q", f"{where}.offset")
    return GGUFTensorInfo(name, shape, ggml_type, offset)


def _alignment(value: Any, file: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1) or value % 8:
        raise InvalidCarton(file, f"{value!r} is not a power of two of at least 8", field="general.alignment")
    return value


class _Cursor:
    """Reads the header front to back through ``read_at``, a chunk at a
    time, checking each length against the bytes the file and the limit
    leave before reading it."""

    def __init__(self, read_at: ReadAt, file_size: int, file: str) -> None:
        self._read_at, self.file = read_at, file
        self._end = min(file_size, GGUF_HEADER_LIMIT)
        self._file_size = file_size
        self.offset = 0
        self._buffer, self._buffer_at = b"", 0

    def _left(self) -> int:
        return self._end - self.offset

    def _short(self, size: int, where: str) -> InvalidCarton:
        if self.offset + size > self._file_size:
            problem = f"needs {size} bytes at offset {self.offset}, past the end of the file ({self._file_size} bytes)"
        else:
            problem = f"needs {size} bytes at offset {self.offset}, past the {GGUF_HEADER_LIMIT}-byte header limit"
        return InvalidCarton(self.file, problem, field=where)

    def take(self, size: int, where: str) -> bytes:
        if size > self._left():
            raise self._short(size, where)
        start = self.offset - self._buffer_at
        if start + size > len(self._buffer):
            want = min(max(size, _CHUNK), self._left())
            self._buffer, self._buffer_at, start = self._read_at(self.offset, want), self.offset, 0
            if len(self._buffer) < size:
                raise InvalidCarton(self.file, f"ends at offset {self.offset + len(self._buffer)}, inside "
                                    f"its header (the file was said to be {self._file_size} bytes)", field=where)
        self.offset += size
        return self._buffer[start:start + size]

    def skip(self, size: int, where: str) -> None:
        if size > self._left():
            raise self._short(size, where)
        self.offset += size

    def skip_strings(self, count: int, where: str) -> None:
        """Past ``count`` strings, reading only their lengths (from the
        buffer while it holds them: a vocabulary is 100,000 strings)."""
        for _ in range(count):
            at = self.offset - self._buffer_at
            if at + 8 <= len(self._buffer):
                size = _U64.unpack_from(self._buffer, at)[0]
                if 8 + size <= self._left():
                    self.offset += 8 + size
                    continue
            self.skip(int.from_bytes(self.take(8, f"{where} length"), "little"), where)

    def check_bools(self, count: int, where: str) -> None:
        """Past ``count`` bools, a chunk at a time, each 0 or 1."""
        while count:
            chunk = self.take(min(count, _CHUNK), where)
            if chunk.translate(None, b"\0\1"):
                raise InvalidCarton(self.file, "a bool must be 0 or 1", field=where)
            count -= len(chunk)

    def scalar(self, fmt: str, where: str) -> Any:
        value: Any = struct.unpack(fmt, self.take(struct.calcsize(fmt), where))[0]
        return value

    def count(self, where: str, *, per_item: int, most: int | None = None) -> int:
        """A uint64 count of items taking at least ``per_item`` bytes each,
        and at most ``most`` of them."""
        n: int = self.scalar("<Q", where)
        if most is not None and n > most:
            raise InvalidCarton(self.file, f"{n} items are more than the {most} read", field=where)
        if n * per_item > self._left():
            raise InvalidCarton(self.file, f"{n} items of at least {per_item} bytes each do not fit in the "
                                f"{self._left()} bytes left", field=where)
        return n

    def string(self, where: str) -> str:
        size: int = self.scalar("<Q", f"{where} length")
        raw = self.take(size, where)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidCarton(self.file, f"is not UTF-8 text (bad byte at {e.start})", field=where) from None

    def value(self, code: int, where: str, depth: int) -> Any:
        if code in _SCALARS:
            name, fmt = _SCALARS[code]
            value = self.scalar(fmt, where)
            if name == "bool" and value > 1:
                raise InvalidCarton(self.file, f"a bool must be 0 or 1, not {value}", field=where)
            return bool(value) if name == "bool" else value
        if code == _STRING:
            return self.string(where)
        if code == _ARRAY:
            return self._array(where, depth)
        raise InvalidCarton(self.file, f"value type {code} is not a GGUF type (0 to 12)", field=f"{where}.type")

    def _array(self, where: str, depth: int) -> GGUFArray:
        if depth >= MAX_ARRAY_NESTING:
            raise InvalidCarton(self.file, f"arrays nest over {MAX_ARRAY_NESTING} deep", field=where)
        code = self.scalar("<I", f"{where}.type")
        if code not in _MIN_VALUE_SIZE:
            raise InvalidCarton(self.file, f"element type {code} is not a GGUF type (0 to 12)", field=f"{where}.type")
        length = self.count(f"{where}.length", per_item=_MIN_VALUE_SIZE[code])
        if code == _ARRAY and length > MAX_NESTED_ARRAYS:
            raise InvalidCarton(self.file, f"holds {length} arrays, over {MAX_NESTED_ARRAYS}", field=f"{where}.length")
        element = _SCALARS[code][0] if code in _SCALARS else ("string" if code == _STRING else "array")
        kept = tuple(self.value(code, f"{where}[{i}]", depth + 1) for i in range(min(length, ARRAY_VALUES_KEPT)))
        rest = length - len(kept)
        if code in _SCALARS and code != _BOOL:
            self.skip(rest * _MIN_VALUE_SIZE[code], where)
        elif code == _STRING:   # a vocabulary: each length read and skipped, none decoded
            self.skip_strings(rest, where)
        elif code == _BOOL:
            self.check_bools(rest, where)
        else:
            for i in range(len(kept), length):
                self.value(code, f"{where}[{i}]", depth + 1)
        return GGUFArray(element, length, kept)


def parse_gguf_bytes(data: bytes, *, file: str) -> GGUFHeader:
    """The header of a GGUF file held in memory (or its first bytes, with
    the file's size the bytes' length)."""
    return parse_gguf(read_at_bytes(data), len(data), file=file)
