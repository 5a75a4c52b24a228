"""GGUF headers (format/gguf.py): files written by llama.cpp's own writer
(the gguf package) read as its reader reads them, and hostile headers built
by hand refused by name, quickly, without reading past what they hold."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from kit.modelfiles import gguf_file

from cartonstore.errors import InvalidCarton
from cartonstore.format.gguf import (
    ARRAY_VALUES_KEPT,
    GGUF_HEADER_LIMIT,
    MAX_NESTED_ARRAYS,
    GGUFArray,
    parse_gguf,
    parse_gguf_bytes,
)

FILE = "model/m.gguf"


def test_a_file_llama_cpps_writer_made_reads_as_its_reader_reads_it(tmp_path: Path) -> None:
    import gguf

    shapes = {"token_embd.weight": (40, 16), "blk.0.attn_q.weight": (16, 16), "output_norm.weight": (16,)}
    path = gguf_file(tmp_path / "m.gguf", file_type=15, tensors=shapes, context_length=8192, vocabulary=300)
    header = parse_gguf_bytes(path.read_bytes(), file=FILE)
    reader = gguf.GGUFReader(path)
    assert [(t.name, t.shape) for t in header.tensors] == [(t.name, tuple(int(d) for d in t.shape))
                                                           for t in reader.tensors]
    assert header.data_start + header.tensors[-1].offset == int(reader.tensors[-1].data_offset)
    assert header.summary() == {
        "version": 3, "architecture": "llama", "name": "Tiny Llama", "quantization": "Q4_K_M",
        "parameters": 40 * 16 + 16 * 16 + 16, "tensors": 3, "tensor_types": {"F32": 3},
        "context_length": 8192, "embedding_length": 16, "block_count": 2}
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert tokens == GGUFArray("string", 300, tuple(f"tok{i}" for i in range(ARRAY_VALUES_KEPT)))
    assert header.metadata["tiny.tested"] is True


def test_the_header_is_read_through_read_at_and_never_the_tensors(tmp_path: Path) -> None:
    path = gguf_file(tmp_path / "big.gguf", tensors={"w": (1024, 1024)})
    data = path.read_bytes()
    asked: list[tuple[int, int]] = []

    def read_at(offset: int, size: int) -> bytes:
        asked.append((offset, size))
        return data[offset:offset + size]
    header = parse_gguf(read_at, len(data), file=FILE)
    assert header.parameter_count == 1 << 20
    assert max(offset + size for offset, size in asked) <= header.data_start + (1 << 20)
    assert sum(size for _, size in asked) < len(data)


# -- hostile headers, written by hand ---------------------------------------

def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, code: int, value: bytes) -> bytes:
    return _s(key) + struct.pack("<I", code) + value


def _gguf(kvs: tuple[bytes, ...] | list[bytes] = (), tensors: tuple[bytes, ...] | list[bytes] = (), *, version: int = 3,
          counts: tuple[int, int] | None = None, tail: bytes = b"\0" * 64) -> bytes:
    n_tensors, n_kvs = counts if counts is not None else (len(tensors), len(kvs))
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kvs) + b"".join(kvs) + b"".join(tensors) + tail


def _tensor(name: str, shape: tuple[int, ...], offset: int = 0, ggml_type: int = 0) -> bytes:
    return _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) \
        + struct.pack("<IQ", ggml_type, offset)


def _refused(blob: bytes, *fragments: str, size: int | None = None) -> InvalidCarton:
    with pytest.raises(InvalidCarton) as info:
        parse_gguf(lambda offset, n: blob[offset:offset + n], len(blob) if size is None else size, file=FILE)
    message = str(info.value)
    assert message.startswith(FILE), message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_every_value_type_reads() -> None:
    kvs = [_kv("u8", 0, b"\xff"), _kv("i8", 1, b"\xff"), _kv("u16", 2, struct.pack("<H", 65535)),
           _kv("i16", 3, struct.pack("<h", -2)), _kv("u32", 4, struct.pack("<I", 7)),
           _kv("i32", 5, struct.pack("<i", -7)), _kv("f32", 6, struct.pack("<f", 0.5)), _kv("b", 7, b"\0"),
           _kv("s", 8, _s("héllo")), _kv("u64", 10, struct.pack("<Q", 2**64 - 1)),
           _kv("i64", 11, struct.pack("<q", -(2**63))), _kv("f64", 12, struct.pack("<d", 1.25)),
           _kv("nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 1) + struct.pack("<I", 3)
               + struct.pack("<IQ", 8, 1) + _s("x"))]
    meta = parse_gguf_bytes(_gguf(kvs, version=2), file=FILE).metadata
    assert meta == {"u8": 255, "i8": -1, "u16": 65535, "i16": -2, "u32": 7, "i32": -7, "f32": 0.5, "b": False,
                    "s": "héllo", "u64": 2**64 - 1, "i64": -(2**63), "f64": 1.25,
                    "nested": GGUFArray("array", 2, (GGUFArray("uint32", 1, (3,)), GGUFArray("string", 1, ("x",))))}


@pytest.mark.parametrize(("blob", "fragments"), [
    (b"GGML" + bytes(20), ("magic", "not the GGUF magic")),
    (_gguf(version=1), ("version", "version 1; versions 2 and 3")),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0) + bytes(32), ("version", "big-endian")),
    (b"GGUF\x03\0", ("version", "past the end of the file")),
    (_gguf(counts=(0, 2**62)), ("metadata_kv_count", "more than the 65536 read")),
    (_gguf(counts=(0, 5000)), ("metadata_kv_count", "do not fit")),
    (_gguf(counts=(2**40, 0)), ("tensor_count", "more than the 262144 read")),
    (_gguf(counts=(2**18 + 1, 0)), ("tensor_count", "262145 items are more than the 262144 read")),
    (_gguf(counts=(5000, 0)), ("tensor_count", "do not fit")),
    (_gguf([struct.pack("<Q", 2**63) + b"k"]), ("metadata[0].key: needs 9223372036854775808 bytes", "past the end of the file")),
    (_gguf([_kv("k", 13, b"")]), ("metadata 'k'.type", "value type 13 is not a GGUF type")),
    (_gguf([_kv("k", 9, struct.pack("<IQ", 4, 2**61))]), ("metadata 'k'.length", "do not fit")),
    (_gguf([_kv("k", 9, struct.pack("<IQ", 8, 2**60))]), ("metadata 'k'.length", "do not fit")),
    (_gguf([_kv("k", 9, struct.pack("<IQ", 13, 1))]), ("element type 13",)),
    (_gguf([_kv("k", 9, struct.pack("<IQ", 9, 1) * 10)]), ("arrays nest over 8 deep",)),
    (_gguf([_kv("k", 7, b"\x02")]), ("metadata 'k'", "a bool must be 0 or 1, not 2")),
    (_gguf([_kv("k", 8, _s(b"\xff\xfe"))]), ("metadata 'k'", "not UTF-8")),
    (_gguf([_kv("k", 4, b"\0\0\0\0"), _kv("k", 4, b"\0\0\0\0")]), ("metadata 'k'", "a key already given")),
    (_gguf([_kv("general.alignment", 4, struct.pack("<I", 12))]), ("general.alignment", "not a power of two")),
    (_gguf(tensors=[_tensor("w", (1, 1, 1, 1, 1))]), ("tensor 'w'.n_dimensions", "5 dimensions, over ggml's 4")),
    (_gguf(tensors=[_tensor("w", (2**32, 2**32))]), ("tensor 'w'.dimensions", "more elements")),
    (_gguf(tensors=[_tensor("w", (4,), offset=3)]), ("tensor 'w'.offset", "not a multiple of the alignment 32")),
    (_gguf(tensors=[_tensor("w", (4,), offset=2**40)]), ("tensor 'w'.offset", "past the end of the file")),
])
def test_a_hostile_header_is_refused_by_name(blob: bytes, fragments: tuple[str, ...]) -> None:
    _refused(blob, *fragments)


def test_a_file_shorter_than_its_size_says_where_it_ends() -> None:
    blob = _gguf([_kv("general.name", 8, _s("x" * 100))], tail=b"")[:60]
    _refused(blob, "ends at offset 60, inside its header", size=10_000)


def test_a_header_past_the_limit_is_refused_without_reading_it() -> None:
    asked: list[int] = []
    head = _gguf([struct.pack("<Q", GGUF_HEADER_LIMIT) + b"k"], tail=b"")

    def read_at(offset: int, size: int) -> bytes:
        asked.append(size)
        return head[offset:offset + size]
    with pytest.raises(InvalidCarton, match="header limit"):
        parse_gguf(read_at, 100 << 30, file=FILE)
    assert sum(asked) <= 2 << 20


def test_a_million_element_array_is_skipped_not_kept() -> None:
    n = 1_000_000
    blob = _gguf([_kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, n) + bytes(4 * n))])
    scores = parse_gguf_bytes(blob, file=FILE).metadata["tokenizer.ggml.scores"]
    assert (scores.length, len(scores.values)) == (n, ARRAY_VALUES_KEPT)


def test_the_quantization_is_named_or_numbered() -> None:
    def quantization(code: Any) -> str | None:
        return parse_gguf_bytes(_gguf([_kv("general.file_type", 4, struct.pack("<I", code))]),
                                file=FILE).quantization
    assert [quantization(c) for c in (0, 1, 2, 7, 15, 18, 32, 999)] == [
        "F32", "F16", "Q4_0", "Q8_0", "Q4_K_M", "Q6_K", "BF16", "file type 999"]
    assert parse_gguf_bytes(_gguf(), file=FILE).quantization is None


def test_long_arrays_are_checked_past_the_values_kept() -> None:
    n = 4_000_000
    bools = _gguf([_kv("flags", 9, struct.pack("<IQ", 7, n) + b"\1" * (n - 1) + b"\2")])
    _refused(bools, "metadata 'flags'", "a bool must be 0 or 1")
    words = [_s("w") for _ in range(100)]
    vocabulary = _gguf([_kv("tokens", 9, struct.pack("<IQ", 8, 101) + b"".join(words) + struct.pack("<Q", 2**40))])
    _refused(vocabulary, "metadata 'tokens': needs 1099511627776 bytes", "past the end of the file")
    nested = _gguf([_kv("k", 9, struct.pack("<IQ", 9, MAX_NESTED_ARRAYS + 1) + bytes(12 * (MAX_NESTED_ARRAYS + 1)))])
    _refused(nested, "metadata 'k'.length", f"holds {MAX_NESTED_ARRAYS + 1} arrays")
