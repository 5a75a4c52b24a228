"""Reading zips: the real carton fixture, archives from other writers, zip64
parsing on hand-built records, and the bounded streaming decoders."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import time
import zipfile
import zlib
from pathlib import Path

import pytest
import zstandard

from cartonstore.errors import InvalidCarton
from cartonstore.zipfmt import (
    TAIL_READ_SIZE,
    CentralDirectoryLocation,
    ZipEntry,
    ZipLimits,
    ZipReader,
    ZipWriter,
    locate_central_directory,
    make_decoder,
    parse_central_directory,
)
from cartonstore.zipfmt.layout import DEFLATED, STORED, ZSTD

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "carton-repo-test.carton"
FIXTURE_MANIFEST_SHA256 = "f1cae5143a92a44e3a7e1d9c32a0245065dfb6e0f1e91c18b5e44356d081dfb5"
FIXTURE_NAMES = [
    "carton.toml",
    "misc/_example_misc_file_0",
    "misc/model_architecture.png",
    "tensor_data/tensor_2.bin",
    "tensor_data/tensor_3.bin",
    "tensor_data/tensor_0.bin",
    "tensor_data/index.toml",
    "tensor_data/tensor_1.toml",
    "model/main.py",
    "model/.carton/carton.lock",
    "model/requirements.txt",
    "MANIFEST",
]


def read_entry(reader: ZipReader, entry: ZipEntry, chunk: int = 1 << 20) -> bytes:
    stream = reader.open(entry)
    parts = []
    while part := stream.read(chunk):
        assert len(part) <= chunk
        parts.append(part)
    return b"".join(parts)


# --- the real fixture -------------------------------------------------------


def test_fixture_lists_entries_in_central_directory_order() -> None:
    with ZipReader(FIXTURE) as reader:
        assert [entry.name for entry in reader.entries] == FIXTURE_NAMES
        methods = {entry.name: entry.method for entry in reader.entries}
    assert methods.pop("MANIFEST") == STORED
    assert set(methods.values()) == {ZSTD}


def test_fixture_every_entry_decodes_with_matching_size_and_crc() -> None:
    with ZipReader(FIXTURE) as reader:
        for entry in reader.entries:
            data = read_entry(reader, entry)
            assert len(data) == entry.uncompressed_size
            assert zlib.crc32(data) == entry.crc32


def test_fixture_manifest_hash() -> None:
    with ZipReader(FIXTURE) as reader:
        (manifest,) = [e for e in reader.entries if e.name == "MANIFEST"]
        data = reader.open(manifest).read()
    assert hashlib.sha256(data).hexdigest() == FIXTURE_MANIFEST_SHA256


def test_fixture_data_span_holds_the_compressed_bytes() -> None:
    # Decode the raw span with zstandard directly: an independent check of
    # data_span and of our streaming decoder.
    raw = FIXTURE.read_bytes()
    with ZipReader(FIXTURE) as reader:
        for entry in reader.entries:
            offset, length = reader.data_span(entry)
            assert length == entry.compressed_size
            compressed = raw[offset : offset + length]
            if entry.method == ZSTD:
                expected = zstandard.ZstdDecompressor().decompressobj().decompress(compressed)
            else:
                expected = compressed
            assert read_entry(reader, entry, chunk=4096) == expected


def test_fixture_reads_from_a_file_object_without_descriptor() -> None:
    with ZipReader(io.BytesIO(FIXTURE.read_bytes())) as reader:
        manifest = reader.entries[-1]
        data = reader.open(manifest).read()
    assert hashlib.sha256(data).hexdigest() == FIXTURE_MANIFEST_SHA256


def test_entry_stream_is_a_raw_io_object() -> None:
    with ZipReader(FIXTURE) as reader:
        entry = reader.entries[0]
        buffered = io.BufferedReader(reader.open(entry))
        assert (
            hashlib.sha256(buffered.read()).hexdigest()
            == hashlib.sha256(reader.open(entry).readall()).hexdigest()
        )
        stream = reader.open(entry)
        stream.close()
        with pytest.raises(ValueError, match="closed"):
            stream.read(10)


# --- archives written by other tools -----------------------------------------


class _Unseekable(io.RawIOBase):
    """Makes zipfile write data descriptors (flag bit 3), as streaming tools do."""

    def __init__(self, sink: io.BytesIO) -> None:
        self._sink = sink

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]  # the writes zipfile makes
        return self._sink.write(data)


@pytest.mark.parametrize("seekable", [True, False], ids=["seekable", "data-descriptors"])
def test_reads_archives_written_by_python_zipfile(seekable: bool) -> None:
    files = {"a.txt": b"hello " * 1000, "dir/": b"", "b.bin": os.urandom(3000), "é.txt": b"x"}
    sink = io.BytesIO()
    target = sink if seekable else _Unseekable(sink)
    with zipfile.ZipFile(target, "w") as archive:  # type: ignore[arg-type]  # an unseekable file, on purpose
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = (
                zipfile.ZIP_DEFLATED if name.endswith(".txt") else zipfile.ZIP_STORED
            )
            with archive.open(info, "w", force_zip64=name == "b.bin") as out:
                out.write(data)
    with ZipReader(io.BytesIO(sink.getvalue())) as reader:
        got = {entry.name: reader.open(entry).read() for entry in reader.entries}
        assert reader.entries[1].is_dir
    assert got == files


def test_tail_read_size_covers_max_comment_and_zip64_end_records() -> None:
    assert TAIL_READ_SIZE == 22 + 65535 + 20 + 56


def test_reads_archive_with_maximal_comment() -> None:
    sink = io.BytesIO()
    with zipfile.ZipFile(sink, "w") as archive:
        archive.writestr("a", b"data")
        archive.comment = b"PK\x05\x06" + b"c" * 65531  # a fake end record inside
    with ZipReader(io.BytesIO(sink.getvalue())) as reader:
        assert [reader.open(e).read() for e in reader.entries] == [b"data"]


# --- zip64 on hand-built records (no 4 GiB file needed) ----------------------


def central_record(name: bytes, *, sizes: tuple[int, int], offset: int, extra: bytes) -> bytes:
    usize, csize = sizes
    return struct.pack(
        "<IHHHHHHIIIHHHHHII", 0x02014B50, 0x033F, 45, 0x800, DEFLATED, 0, 0x21, 0xDEADBEEF,
        csize, usize, len(name), len(extra), 0, 0, 0, 0o100644 << 16, offset,
    ) + name + extra  # fmt: skip


def zip64_extra(*values: int) -> bytes:
    body = b"".join(struct.pack("<Q", value) for value in values)
    return struct.pack("<HH", 0x0001, len(body)) + body


def parse_one(record: bytes) -> ZipEntry:
    location = CentralDirectoryLocation(offset=0, size=len(record), entry_count=1)
    (entry,) = parse_central_directory(record, location, ZipLimits())
    return entry


def test_zip64_extra_supplies_sizes_and_offset() -> None:
    big = 5 << 30
    extra = b"\x99\x99\x02\x00ab" + zip64_extra(big, big // 2, big * 3)
    record = central_record(b"m.bin", sizes=(0xFFFFFFFF,) * 2, offset=0xFFFFFFFF, extra=extra)
    entry = parse_one(record)
    assert (entry.uncompressed_size, entry.compressed_size) == (big, big // 2)
    assert entry.local_header_offset == big * 3
    assert (entry.name, entry.crc32, entry.create_system) == ("m.bin", 0xDEADBEEF, 3)


def test_zip64_extra_holds_only_the_saturated_fields() -> None:
    # Only the compressed size overflows: the extra holds just that value.
    record = central_record(b"m.bin", sizes=(123, 0xFFFFFFFF), offset=7, extra=zip64_extra(6 << 30))
    entry = parse_one(record)
    assert (entry.uncompressed_size, entry.compressed_size, entry.local_header_offset) == (
        123, 6 << 30, 7,
    )  # fmt: skip


def test_zip64_extra_missing_is_an_error() -> None:
    record = central_record(b"m.bin", sizes=(0xFFFFFFFF, 10), offset=0, extra=b"")
    with pytest.raises(
        InvalidCarton, match=r"m\.bin: zip64 extra field is missing or lacks the uncompressed size"
    ):
        parse_one(record)


def test_zip64_extra_too_short_is_an_error() -> None:
    record = central_record(
        b"m.bin", sizes=(0xFFFFFFFF, 0xFFFFFFFF), offset=0, extra=zip64_extra(1 << 33)
    )
    with pytest.raises(InvalidCarton, match="lacks the compressed size"):
        parse_one(record)


def test_zip64_extra_twice_is_an_error() -> None:
    record = central_record(
        b"m.bin", sizes=(0xFFFFFFFF, 5), offset=0, extra=zip64_extra(9) + zip64_extra(10)
    )
    with pytest.raises(InvalidCarton, match="0x0001 appears twice"):
        parse_one(record)


def zip64_tail(cd: bytes, cd_offset: int, count: int) -> bytes:
    record_offset = cd_offset + len(cd)
    zip64_end = struct.pack(
        "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(cd), cd_offset
    )
    locator = struct.pack("<IIQI", 0x07064B50, 0, record_offset, 1)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return cd + zip64_end + locator + end


def test_locate_zip64_central_directory_beyond_4gib() -> None:
    cd_offset = 6 << 30
    cd = central_record(b"a", sizes=(1, 1), offset=0, extra=b"") * 3
    location = locate_central_directory(zip64_tail(cd, cd_offset, 3), cd_offset)
    assert location == CentralDirectoryLocation(offset=cd_offset, size=len(cd), entry_count=3)


def test_locate_zip64_with_more_than_65535_entries() -> None:
    cd = central_record(b"a", sizes=(1, 1), offset=0, extra=b"") * 70_000
    tail = zip64_tail(cd, 1000, 70_000)
    location = locate_central_directory(tail[-TAIL_READ_SIZE:], 1000 + len(tail) - TAIL_READ_SIZE)
    assert location.entry_count == 70_000
    assert location.offset == 1000


def test_locate_zip64_record_not_before_locator_is_an_error() -> None:
    tail = bytearray(zip64_tail(b"", 0, 0))
    struct.pack_into("<Q", tail, 56 + 8, 5)  # the locator's record offset
    with pytest.raises(InvalidCarton, match="zip64 end of central directory record offset 5"):
        locate_central_directory(bytes(tail), 0)


# --- many entries stay fast ---------------------------------------------------


@pytest.mark.slow
def test_opening_10000_entries_is_fast(tmp_path: Path) -> None:
    path = tmp_path / "many.zip"
    with ZipWriter(path) as writer:
        for index in range(10_000):
            writer.add_bytes(f"model/part-{index:05d}.bin", b"%d" % index, method=STORED)
    # CPU time, not wall time: other processes (pytest-xdist workers) share
    # the CPUs, and what is measured is the reader's work.
    timings = []
    for _ in range(3):
        start = time.process_time()
        with ZipReader(path) as reader:
            assert len(reader.entries) == 10_000
        timings.append(time.process_time() - start)
    assert min(timings) < 0.25


# --- decoders -----------------------------------------------------------------


def drain(method: int, compressed: bytes, *, chunk: int, max_length: int) -> bytes:
    decoder = make_decoder(method, "x")
    out = []
    for start in range(0, len(compressed), chunk):
        piece = decoder.decode(compressed[start : start + chunk], max_length)
        assert len(piece) <= max_length
        out.append(piece)
        while not decoder.needs_input:
            piece = decoder.decode(b"", max_length)
            assert len(piece) <= max_length
            out.append(piece)
    decoder.finish()
    return b"".join(out)


def deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_decoders_return_bounded_output_for_any_chunking(chunk: int) -> None:
    data = bytes(3 << 20) + os.urandom(5000) + b"abc" * 50_000
    zstd = zstandard.ZstdCompressor().compress(data)
    cases = [(STORED, data[:300_000]), (DEFLATED, deflate(data)), (ZSTD, zstd)]
    for method, compressed in cases:
        if chunk == 1 and len(compressed) > 100_000:
            continue  # byte-at-a-time over megabytes is slow and adds nothing
        expected = data[:300_000] if method == STORED else data
        assert drain(method, compressed, chunk=chunk, max_length=65536) == expected


def test_zstd_decoder_reads_concatenated_and_skippable_frames() -> None:
    skippable = struct.pack("<II", 0x184D2A5E, 3) + b"???"
    frames = [zstandard.ZstdCompressor(level=1).compress(part) for part in (b"one ", b"two")]
    stream = frames[0] + skippable + frames[1]
    for chunk in (1, 5, len(stream)):
        assert drain(ZSTD, stream, chunk=chunk, max_length=2) == b"one two"


def test_zstd_bomb_chunk_expands_only_by_max_length_per_call() -> None:
    compressed = zstandard.ZstdCompressor().compress(bytes(256 << 20))
    assert len(compressed) < 64 << 10
    decoder = make_decoder(ZSTD, "bomb")
    assert len(decoder.decode(compressed, 1 << 20)) == 1 << 20
    assert not decoder.needs_input


def test_empty_input_is_empty_content_for_every_method() -> None:
    for method in (STORED, DEFLATED, ZSTD):
        decoder = make_decoder(method, "empty")
        assert decoder.needs_input
        decoder.finish()


def test_decoder_refuses_input_before_draining() -> None:
    decoder = make_decoder(DEFLATED, "x")
    decoder.decode(deflate(bytes(1 << 20)), 10)
    with pytest.raises(ValueError, match="before draining"):
        decoder.decode(b"more", 10)
