"""Writing zips: round trips through our reader and, for stored and deflate,
through Python's zipfile and Info-ZIP conventions (interoperability)."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zipfile
import zlib
from pathlib import Path

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.zipfmt import (
    COMPRESSION_METHODS,
    DEFLATED,
    STORED,
    ZSTD,
    ZipReader,
    ZipWriter,
)

# Crosses the 1 MiB chunk size of writer and reader, mixes compressible and
# incompressible bytes.
CONTENT = os.urandom(300_000) + bytes(1 << 20) + b"carton " * 200_000
METHOD_IDS = {STORED: "stored", DEFLATED: "deflate", ZSTD: "zstd"}


def read_back(path: Path) -> dict[str, bytes]:
    with ZipReader(path) as reader:
        return {entry.name: reader.open(entry).read() for entry in reader.entries}


@pytest.mark.parametrize("method", [STORED, DEFLATED, ZSTD], ids=METHOD_IDS.get)
def test_round_trip_through_our_reader(tmp_path: Path, method: int) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        entry = writer.add_file(
            "model/w.bin", io.BytesIO(CONTENT), method=method, size=len(CONTENT)
        )
        writer.add_bytes("small.txt", b"hi", method=method)
    assert (entry.crc32, entry.uncompressed_size) == (zlib.crc32(CONTENT), len(CONTENT))
    assert read_back(path) == {"model/w.bin": CONTENT, "small.txt": b"hi"}
    with ZipReader(path) as reader:
        assert [e.method for e in reader.entries] == [method, method]
        assert reader.entries[0] == entry


@pytest.mark.parametrize("method", [STORED, DEFLATED], ids=METHOD_IDS.get)
@pytest.mark.parametrize("size_known", [True, False], ids=["size-known", "size-unknown"])
def test_python_zipfile_reads_stored_and_deflate(
    tmp_path: Path, method: int, size_known: bool
) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        size = len(CONTENT) if size_known else None
        writer.add_file("model/w.bin", io.BytesIO(CONTENT), method=method, size=size)
        writer.add_bytes("naïve/ünïcode.txt", b"text", method=method)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every CRC checks out
        assert archive.read("model/w.bin") == CONTENT
        assert archive.read("naïve/ünïcode.txt") == b"text"
        info = archive.getinfo("model/w.bin")
    assert info.compress_type == method
    assert zlib.crc32(CONTENT) == info.CRC
    assert info.flag_bits & 0x800  # UTF-8 names
    assert info.flag_bits & 0x8 == 0  # sizes patched in place, no data descriptor


def test_unknown_size_gets_a_zip64_local_header(tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        writer.add_file("a", io.BytesIO(b"abc"), method=STORED)
        writer.add_file("b", io.BytesIO(b"abc"), method=STORED, size=3)
    raw = path.read_bytes()
    # Local header "a": 0xFFFFFFFF sizes and a zip64 extra holding the real ones.
    assert struct.unpack_from("<II", raw, 18) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert raw[31:35] == struct.pack("<HH", 0x0001, 16)
    assert struct.unpack_from("<QQ", raw, 35) == (3, 3)
    with zipfile.ZipFile(path) as archive:
        versions = [info.extract_version for info in archive.infolist()]
        assert archive.read("a") == b"abc"
    assert versions == [45, 20]


def test_entries_carry_fixed_unix_attributes(tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        writer.add_bytes("run.sh", b"#!/bin/sh\n", method=DEFLATED, mode=0o755)
        writer.add_bytes("z.bin", b"z", method=ZSTD)
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    assert [info.date_time for info in infos] == [(1980, 1, 1, 0, 0, 0)] * 2
    assert [info.create_system for info in infos] == [3, 3]
    assert [info.external_attr >> 16 for info in infos] == [0o100755, 0o100644]
    assert [info.extract_version for info in infos] == [20, 63]
    with ZipReader(path) as reader:
        assert [entry.unix_mode for entry in reader.entries] == [0o100755, 0o100644]


def test_symlinks_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        writer.add_bytes("model/w.bin", b"weights", method=ZSTD)
        link = writer.add_symlink("model/latest", "w.bin")
    assert link.is_symlink and link.method == STORED
    with ZipReader(path) as reader:
        entries = {entry.name: entry for entry in reader.entries}
        assert entries["model/latest"].is_symlink
        assert not entries["model/w.bin"].is_symlink
        assert reader.open(entries["model/latest"]).read() == b"w.bin"
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("model/latest").external_attr >> 16 == 0o120777


@pytest.mark.parametrize("method", [STORED, DEFLATED, ZSTD], ids=METHOD_IDS.get)
def test_empty_files_round_trip(tmp_path: Path, method: int) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        writer.add_bytes("empty", b"", method=method)
        writer.add_file("empty-streamed", io.BytesIO(b""), method=method)
    assert read_back(path) == {"empty": b"", "empty-streamed": b""}
    if method != ZSTD:
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None


@pytest.mark.slow
def test_more_than_65535_entries_use_the_zip64_end_record(tmp_path: Path) -> None:
    path = tmp_path / "many.zip"
    count = 70_000
    with ZipWriter(path) as writer:
        for index in range(count):
            writer.add_bytes(f"{index}", b"", method=STORED)
    raw = path.read_bytes()
    eocd = len(raw) - 22
    assert struct.unpack_from("<HH", raw, eocd + 8) == (0xFFFF, 0xFFFF)
    assert raw[eocd - 20 : eocd - 16] == struct.pack("<I", 0x07064B50)  # zip64 locator
    with ZipReader(path) as reader:
        assert len(reader.entries) == count
        assert reader.entries[-1].name == str(count - 1)
    with zipfile.ZipFile(path) as archive:
        assert len(archive.infolist()) == count


def test_output_is_reproducible(tmp_path: Path) -> None:
    digests = set()
    for attempt in range(2):
        path = tmp_path / f"{attempt}.zip"
        with ZipWriter(path) as writer:
            for method in (STORED, DEFLATED, ZSTD):
                writer.add_bytes(f"f{method}", CONTENT[:100_000], method=method)
            writer.add_symlink("l", "f0")
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_levels_change_the_output(tmp_path: Path) -> None:
    sizes = []
    for level in (1, 19):
        path = tmp_path / f"{level}.zip"
        with ZipWriter(path, zstd_level=level, deflate_level=level % 10) as writer:
            writer.add_bytes("a", b"carton " * 50_000 + os.urandom(100), method=ZSTD)
        sizes.append(path.stat().st_size)
        assert read_back(path)["a"].startswith(b"carton ")
    assert sizes[0] != sizes[1]


def test_wrong_size_rolls_the_entry_back(tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    with ZipWriter(path) as writer:
        writer.add_bytes("a", b"first", method=DEFLATED)
        with pytest.raises(ValueError, match="size=10 but the source gave 3 bytes"):
            writer.add_file("b", io.BytesIO(b"abc"), method=DEFLATED, size=10)
        writer.add_bytes("b", b"second", method=DEFLATED)
    assert read_back(path) == {"a": b"first", "b": b"second"}


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "not a valid zip entry name"),
        ("a\0b", "not a valid zip entry name"),
        ("dup", "already in the archive"),
    ],
)
def test_bad_names_are_refused(tmp_path: Path, name: str, problem: str) -> None:
    with ZipWriter(tmp_path / "out.zip") as writer:
        writer.add_bytes("dup", b"", method=STORED)
        with pytest.raises(ValueError, match=problem):
            writer.add_bytes(name, b"x", method=STORED)


def test_unknown_method_is_refused(tmp_path: Path) -> None:
    with ZipWriter(tmp_path / "out.zip") as writer:
        with pytest.raises(ValueError, match="unsupported compression method 12"):
            writer.add_bytes("a", b"x", method=12)
        with pytest.raises(ValueError, match="mode 10000"):
            writer.add_bytes("a", b"x", method=STORED, mode=0o10000)


def test_failure_inside_the_block_leaves_no_valid_zip(tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    with pytest.raises(RuntimeError), ZipWriter(path) as writer:
        writer.add_bytes("a", b"data", method=STORED)
        raise RuntimeError("interrupted")
    with pytest.raises(InvalidCarton, match="no end of central directory record"):
        ZipReader(path)


def test_writes_into_a_file_object_and_leaves_it_open() -> None:
    sink = io.BytesIO()
    with ZipWriter(sink) as writer:
        writer.add_bytes("a", b"data", method=ZSTD)
    assert not sink.closed
    with ZipReader(io.BytesIO(sink.getvalue())) as reader:
        assert reader.open(reader.entries[0]).read() == b"data"


def test_compression_methods_by_name() -> None:
    assert COMPRESSION_METHODS == {"stored": 0, "deflate": 8, "zstd": 93}
    assert (STORED, DEFLATED, ZSTD) == (0, 8, 93)


def _local_extra(data: bytes, offset: int) -> bytes:
    name_length, extra_length = struct.unpack_from("<HH", data, offset + 26)
    return data[offset + 30 + name_length: offset + 30 + name_length + extra_length]


def test_big_stored_entries_start_block_aligned(tmp_path: Path) -> None:
    """A stored entry of 64 KiB or more starts at a multiple of 4096, so a
    store on XFS or btrfs can reflink it (tests/store/test_reflink.py); the padding
    is zipalign's extra field (0xD935: the alignment, then zeros), which other
    readers skip. Small and compressed entries get none."""
    from cartonstore.zipfmt.writer import ALIGN_MIN, ALIGNMENT, ALIGNMENT_EXTRA_ID

    big = os.urandom(ALIGN_MIN)
    path = tmp_path / "aligned.zip"
    with ZipWriter(path) as writer:
        writer.add_bytes("a", b"small", method=STORED)
        writer.add_bytes("model/big.bin", big, method=STORED)
        writer.add_file("model/streamed.bin", io.BytesIO(big), method=STORED)  # size unknown: zip64, aligned too
        writer.add_bytes("model/just-under.bin", big[:-1], method=STORED)
        writer.add_bytes("model/zstd.bin", big, method=ZSTD)
    data = path.read_bytes()
    with ZipReader(path) as reader:
        spans = {e.name: (e.local_header_offset, *reader.data_span(e)) for e in reader.entries}
    for name in ("model/big.bin", "model/streamed.bin"):
        header, start, length = spans[name]
        assert start % ALIGNMENT == 0 and data[start:start + length] == big, name
        extra = _local_extra(data, header)
        at = extra.index(struct.pack("<H", ALIGNMENT_EXTRA_ID))
        _ident, size, alignment = struct.unpack_from("<HHH", extra, at)
        assert alignment == ALIGNMENT and extra[at + 6:] == bytes(size - 2), name
    for name in ("a", "model/just-under.bin", "model/zstd.bin"):
        assert struct.pack("<H", ALIGNMENT_EXTRA_ID) not in _local_extra(data, spans[name][0]), name
    with zipfile.ZipFile(path) as z:  # another reader sees the same files
        assert z.read("model/big.bin") == z.read("model/streamed.bin") == big
        assert z.read("model/just-under.bin") == big[:-1] and z.read("a") == b"small"
