"""Malformed and hostile zips: each is refused with InvalidCarton and a
message that says what is wrong, and nothing else ever escapes."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cartonstore.errors import InvalidCarton
from cartonstore.zipfmt import (
    DEFLATED,
    STORED,
    TAIL_READ_SIZE,
    ZSTD,
    ZipEntry,
    ZipLimits,
    ZipReader,
    ZipWriter,
    check_entry_limits,
    check_no_overlap,
    locate_central_directory,
    make_decoder,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "carton-repo-test.carton"

TEXT = b"".join(b"line %d of a model file\n" % i for i in range(2000))

# Field offsets within a central directory record and the end record.
CD_FLAGS, CD_METHOD, CD_CRC, CD_CSIZE, CD_USIZE, CD_OFFSET, CD_NAME = 8, 10, 16, 20, 24, 42, 46
EOCD_DISK, EOCD_DISK_ENTRIES, EOCD_TOTAL, EOCD_CD_SIZE, EOCD_CD_OFFSET = 4, 8, 10, 12, 16


def build(*entries: tuple[str, bytes, int]) -> bytes:
    sink = io.BytesIO()
    with ZipWriter(sink) as writer:
        for name, data, method in entries:
            writer.add_bytes(name, data, method=method)
    return sink.getvalue()


def sample() -> bytes:
    return build(
        ("model/a.txt", TEXT, DEFLATED), ("model/b.bin", TEXT, ZSTD), ("MANIFEST", b"m", STORED)
    )


def read_all(raw: bytes, limits: ZipLimits | None = None) -> dict[str, bytes]:
    with ZipReader(io.BytesIO(raw), limits) as reader:
        return {entry.name: reader.open(entry).read() for entry in reader.entries}


def cd_records(raw: bytes) -> list[int]:
    """Absolute offset of each central directory record."""
    tail_offset = max(0, len(raw) - TAIL_READ_SIZE)
    location = locate_central_directory(raw[tail_offset:], tail_offset)
    offsets, pos = [], location.offset
    for _ in range(location.entry_count):
        offsets.append(pos)
        name, extra, comment = struct.unpack_from("<HHH", raw, pos + 28)
        pos += 46 + name + extra + comment
    return offsets


def eocd(raw: bytes) -> int:
    return raw.rfind(b"PK\x05\x06")


def patch(raw: bytes, offset: int, fmt: str, *values: int) -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, offset, *values)
    return bytes(data)


def data_offset(raw: bytes, name: str) -> int:
    with ZipReader(io.BytesIO(raw)) as reader:
        (entry,) = [e for e in reader.entries if e.name == name]
        return reader.data_span(entry)[0]


def test_sample_is_valid() -> None:
    assert read_all(sample()) == {"model/a.txt": TEXT, "model/b.bin": TEXT, "MANIFEST": b"m"}


# --- truncation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "where", ["mid local data", "mid central directory", "mid end record", "last byte"]
)
def test_truncated_file_has_no_end_record(where: str) -> None:
    raw = sample()
    cut = {
        "mid local data": 100,
        "mid central directory": cd_records(raw)[1] + 20,
        "mid end record": len(raw) - 10,
        "last byte": len(raw) - 1,
    }[where]
    with pytest.raises(
        InvalidCarton,
        match=r"^zip: not a zip file, or truncated: no end of central directory record found$",
    ):
        read_all(raw[:cut])


def test_truncated_fixture_is_refused() -> None:
    raw = FIXTURE.read_bytes()
    with pytest.raises(InvalidCarton, match="no end of central directory record"):
        read_all(raw[: len(raw) // 2])


def test_bytes_missing_before_the_central_directory() -> None:
    raw = sample()
    cd = cd_records(raw)[0]
    with pytest.raises(
        InvalidCarton,
        match=r"zip: central directory \(offset \d+, \d+ bytes\) runs past the end records at offset \d+: the file is truncated",
    ):
        read_all(raw[: cd - 50] + raw[cd:])


def test_end_record_pointing_past_the_file() -> None:
    raw = sample()
    bad = patch(raw, eocd(raw) + EOCD_CD_OFFSET, "<I", len(raw) + 1000)
    with pytest.raises(InvalidCarton, match="runs past the end records"):
        read_all(bad)


def test_central_directory_truncated_before_its_last_entries() -> None:
    names = [f"model/{'x' * 60}-{i}" for i in range(3)]
    raw = build(*((name, b"", STORED) for name in names))
    end = eocd(raw)
    bad = patch(raw, end + EOCD_DISK_ENTRIES, "<HH", 5, 5)
    with pytest.raises(
        InvalidCarton, match=r"^zip: central directory truncated: expected 5 entries, found 3$"
    ):
        read_all(bad)


def test_central_directory_with_more_records_than_counted() -> None:
    raw = sample()
    bad = patch(raw, eocd(raw) + EOCD_DISK_ENTRIES, "<HH", 2, 2)
    with pytest.raises(
        InvalidCarton, match=r"central directory has \d+ unexpected bytes after its 2 entries"
    ):
        read_all(bad)


def test_counts_too_big_for_the_central_directory() -> None:
    raw = sample()
    bad = patch(raw, eocd(raw) + EOCD_DISK_ENTRIES, "<HH", 0xFFFE, 0xFFFE)
    with pytest.raises(
        InvalidCarton,
        match=r"inconsistent counts: a central directory of \d+ bytes cannot hold 65534 entries",
    ):
        read_all(bad)


def test_inconsistent_entry_counts() -> None:
    raw = sample()
    bad = patch(raw, eocd(raw) + EOCD_DISK_ENTRIES, "<H", 2)
    with pytest.raises(
        InvalidCarton, match="inconsistent entry counts: 2 on this disk but 3 in total"
    ):
        read_all(bad)


def test_multi_disk_archive() -> None:
    raw = sample()
    with pytest.raises(InvalidCarton, match="multi-disk"):
        read_all(patch(raw, eocd(raw) + EOCD_DISK, "<H", 1))


def test_garbage_between_central_directory_and_end_record() -> None:
    raw = sample()
    end = eocd(raw)
    with pytest.raises(
        InvalidCarton, match="7 unexpected bytes between the central directory and the end records"
    ):
        read_all(raw[:end] + b"garbage" + raw[end:])


def test_stream_cut_short_by_a_smaller_compressed_size() -> None:
    raw = sample()
    records = cd_records(raw)
    (deflate_size,) = struct.unpack_from("<I", raw, records[0] + CD_CSIZE)
    (zstd_size,) = struct.unpack_from("<I", raw, records[1] + CD_CSIZE)
    with pytest.raises(InvalidCarton, match=r"^model/a\.txt: deflate data is truncated"):
        read_all(patch(raw, records[0] + CD_CSIZE, "<I", deflate_size - 10))
    with pytest.raises(InvalidCarton, match=r"^model/b\.bin: zstd data is truncated"):
        read_all(patch(raw, records[1] + CD_CSIZE, "<I", zstd_size - 10))


# --- local headers -----------------------------------------------------------------


def test_local_header_missing() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[1] + CD_OFFSET, "<I", 5)
    with pytest.raises(
        InvalidCarton, match=r"^model/b\.bin: no local file header at offset 5 \(bad signature\)"
    ):
        read_all(bad)


def test_local_header_past_the_end_of_file() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[1] + CD_OFFSET, "<I", len(raw) - 3)
    with pytest.raises(
        InvalidCarton,
        match=r"^model/b\.bin: file is truncated: local header at offset \d+ runs past its end",
    ):
        read_all(bad)


def test_local_name_differs_from_central_name() -> None:
    raw = sample()
    bad = raw.replace(b"model/a.txt", b"model/A.txt", 1)  # the first is the local header
    with pytest.raises(InvalidCarton, match=r"model/a\.txt: local header names it b'model/A\.txt'"):
        read_all(bad)


def test_compressed_data_running_into_the_central_directory() -> None:
    raw = sample()
    record = cd_records(raw)[1]
    bad = patch(raw, record + CD_CSIZE, "<I", 10_000)
    with pytest.raises(
        InvalidCarton, match=r"model/b\.bin: data \(bytes \d+-\d+\) runs into the central directory"
    ):
        read_all(bad)


# --- overlapping entries --------------------------------------------------------------


def test_entry_whose_data_covers_the_next_entry() -> None:
    raw = build(("a", TEXT, DEFLATED), ("b", TEXT, DEFLATED))
    cd_offset = cd_records(raw)[0]
    a_data = 30 + len("a")
    # "a" now claims everything up to the central directory, "b" included.
    bad = patch(raw, cd_offset + CD_CSIZE, "<I", cd_offset - a_data)
    with pytest.raises(InvalidCarton, match=r"^b: overlaps entry 'a' \(bytes \d+-\d+ and 0-\d+\)"):
        read_all(bad)


def test_two_records_sharing_one_local_header() -> None:
    raw = build(("a", TEXT, DEFLATED))
    (record,) = cd_records(raw)
    end = eocd(raw)
    copy = raw[record:end]
    bad = raw[:end] + copy + raw[end:]
    bad = patch(bad, eocd(bad) + EOCD_DISK_ENTRIES, "<HHI", 2, 2, 2 * len(copy))
    with pytest.raises(InvalidCarton, match="^a: overlaps entry 'a'"):
        read_all(bad)


def entry(name: str) -> ZipEntry:
    return ZipEntry(name, DEFLATED, 0x800, 0, 10, 10, 0, 0, 3)


def test_check_no_overlap_on_spans() -> None:
    check_no_overlap([(entry("b"), 50, 90), (entry("a"), 0, 50)], cd_offset=90)  # touching is fine
    with pytest.raises(InvalidCarton, match=r"^c: overlaps entry 'a' \(bytes 40-60 and 0-50\)"):
        check_no_overlap(
            [(entry("a"), 0, 50), (entry("b"), 60, 70), (entry("c"), 40, 60)], cd_offset=100
        )
    with pytest.raises(
        InvalidCarton,
        match=r"^b: data \(bytes 60-101\) runs into the central directory at byte 100",
    ):
        check_no_overlap([(entry("a"), 0, 50), (entry("b"), 60, 101)], cd_offset=100)


# --- entry fields -------------------------------------------------------------------


def test_encrypted_entry() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[0] + CD_FLAGS, "<H", 0x801)
    with pytest.raises(
        InvalidCarton, match=r"^model/a\.txt: is encrypted; encrypted entries are not supported$"
    ):
        read_all(bad)


def test_unknown_compression_method() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[0] + CD_METHOD, "<H", 12)
    with pytest.raises(
        InvalidCarton, match=r"^model/a\.txt: uses compression method 12 \(bzip2\); only stored"
    ):
        read_all(bad)


def test_nul_in_name() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[2] + CD_NAME + 3, "<B", 0)
    with pytest.raises(
        InvalidCarton,
        match=r"^zip: central directory record 3: entry name 'MAN\\x00FEST' contains a NUL byte$",
    ):
        read_all(bad)


def test_name_not_utf8() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[2] + CD_NAME, "<B", 0xFF)
    with pytest.raises(
        InvalidCarton, match="central directory record 3: name .* is not valid UTF-8"
    ):
        read_all(bad)


def test_corrupt_central_record_signature() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[1], "<I", 0x12345678)
    with pytest.raises(
        InvalidCarton, match=r"^zip: central directory record 2 is corrupt \(bad signature\)$"
    ):
        read_all(bad)


def test_stored_entry_with_different_sizes() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[2] + CD_USIZE, "<I", 2)
    with pytest.raises(
        InvalidCarton,
        match="MANIFEST: is stored uncompressed but declares 1 bytes of data for a size of 2 bytes",
    ):
        read_all(bad)


def test_not_a_zip_at_all() -> None:
    junk = bytes((i * 7919 + 13) % 251 for i in range(5000))
    for data in (junk, b"", b"PK\x05\x06"):
        with pytest.raises(InvalidCarton, match="^zip: not a zip file, or truncated"):
            read_all(data)


# --- content that lies ---------------------------------------------------------------


@pytest.mark.parametrize("method", [DEFLATED, ZSTD], ids=["deflate", "zstd"])
def test_corrupted_compressed_bytes(method: int) -> None:
    raw = build(("w.bin", TEXT, method))
    start = data_offset(raw, "w.bin")
    if method == DEFLATED:
        bad, problem = patch(raw, start, "<B", 0x07), r"corrupt deflate data \(.*invalid block type"
    else:
        header = zstandard.frame_header_size(raw[start : start + 18])
        bad, problem = (
            patch(raw, start + header, "<B", raw[start + header] | 0x06),
            r"corrupt zstd data \(zstd block has the reserved block type\)",
        )
    with pytest.raises(InvalidCarton, match=rf"^w\.bin: {problem}"):
        read_all(bad)


def test_corrupted_zstd_block_content() -> None:
    raw = build(("w.bin", TEXT, ZSTD))
    start = data_offset(raw, "w.bin")
    bad = bytearray(raw)
    bad[start + 20 : start + 200] = bytes(range(180))
    with pytest.raises(
        InvalidCarton,
        match=r"^w\.bin: (corrupt zstd data \(zstd decompressor error|CRC-32 mismatch)",
    ):
        read_all(bytes(bad))


def test_bad_zstd_magic() -> None:
    raw = build(("w.bin", TEXT, ZSTD))
    bad = patch(raw, data_offset(raw, "w.bin"), "<I", 0x11223344)
    with pytest.raises(
        InvalidCarton, match=r"w\.bin: corrupt zstd data \(bad zstd frame magic number 0x11223344\)"
    ):
        read_all(bad)


def test_crc_mismatch() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[1] + CD_CRC, "<I", zlib.crc32(TEXT) ^ 1)
    with pytest.raises(
        InvalidCarton,
        match=r"^model/b\.bin: CRC-32 mismatch: the central directory says [0-9a-f]{8}, the content has [0-9a-f]{8}",
    ):
        read_all(bad)


@pytest.mark.parametrize("method", [DEFLATED, ZSTD], ids=["deflate", "zstd"])
def test_declared_size_smaller_than_content_stops_early(method: int) -> None:
    bomb = bytes(32 << 20)  # compresses to a few KiB; below the ratio floor
    raw = build(("bomb.bin", bomb, method))
    bad = patch(raw, cd_records(raw)[0] + CD_USIZE, "<I", 1000)
    delivered = 0
    with ZipReader(io.BytesIO(bad)) as reader:
        stream = reader.open(reader.entries[0])
        with pytest.raises(
            InvalidCarton, match=r"^bomb\.bin: declared size 1000 bytes but it decodes to more$"
        ):
            while chunk := stream.read(1 << 20):
                delivered += len(chunk)
    assert delivered <= 1000


@pytest.mark.parametrize("method", [DEFLATED, ZSTD], ids=["deflate", "zstd"])
def test_declared_size_bigger_than_content(method: int) -> None:
    raw = build(("w.bin", TEXT, method))
    bad = patch(raw, cd_records(raw)[0] + CD_USIZE, "<I", len(TEXT) + 1)
    with pytest.raises(
        InvalidCarton,
        match=rf"^w\.bin: declared size {len(TEXT) + 1} bytes but it decodes to only {len(TEXT)}$",
    ):
        read_all(bad)


def test_data_after_the_end_of_the_stream() -> None:
    for method, name in ((DEFLATED, "deflate"), (ZSTD, "zstd")):
        compressed = zlib.compressobj(6, zlib.DEFLATED, -15) if method == DEFLATED else None
        stream = (
            compressed.compress(b"data") + compressed.flush()
            if compressed
            else zstandard.ZstdCompressor().compress(b"data")
        )
        decoder = make_decoder(method, "x")
        expected = (
            "continues past the end of the deflate stream"
            if name == "deflate"
            else "bad zstd frame magic"
        )
        with pytest.raises(InvalidCarton, match=expected):
            decoder.decode(stream + b"trailing junk!")
            while not decoder.needs_input:
                decoder.decode()


# --- limits --------------------------------------------------------------------------


def test_compression_ratio_over_the_limit() -> None:
    raw = build(("zeros.bin", bytes(2 << 20), DEFLATED))
    limits = ZipLimits(ratio_floor=1 << 20, max_ratio=100)
    with pytest.raises(
        InvalidCarton,
        match=r"^zeros\.bin: compression ratio too high: \d+ bytes would decode to 2097152 \(more than 100:1\)",
    ):
        read_all(raw, limits)
    assert read_all(raw, ZipLimits())["zeros.bin"] == bytes(2 << 20)  # exempt under the floor


def test_huge_declared_size_trips_the_ratio_with_default_limits() -> None:
    raw = sample()
    bad = patch(raw, cd_records(raw)[0] + CD_USIZE, "<I", 0xF0000000)
    with pytest.raises(InvalidCarton, match=r"^model/a\.txt: compression ratio too high"):
        read_all(bad)


def test_entry_over_the_size_limit() -> None:
    with pytest.raises(InvalidCarton, match=r"^w: declared size 11 bytes exceeds the limit of 10$"):
        check_entry_limits(
            ZipEntry("w", STORED, 0, 0, 11, 11, 0, 0, 3), ZipLimits(max_entry_size=10)
        )
    with pytest.raises(
        InvalidCarton, match=r"^model/a\.txt: declared size \d+ bytes exceeds the limit of 100$"
    ):
        read_all(sample(), ZipLimits(max_entry_size=100))


def test_too_many_entries() -> None:
    with pytest.raises(InvalidCarton, match=r"^zip: has 3 entries; the limit is 2$"):
        read_all(sample(), ZipLimits(max_entries=2))


def test_central_directory_over_the_size_limit() -> None:
    with pytest.raises(
        InvalidCarton, match=r"^zip: central directory is \d+ bytes; the limit is 100$"
    ):
        read_all(sample(), ZipLimits(max_central_directory_size=100))


# --- fuzz ----------------------------------------------------------------------------


def with_zip64_end_records(raw: bytes) -> bytes:
    """The same archive ending the way zip64 writers end big archives."""
    end = eocd(raw)
    total, cd_size, cd_offset = struct.unpack_from("<HII", raw, end + EOCD_TOTAL)
    record = struct.pack(
        "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, total, total, cd_size, cd_offset
    )
    locator = struct.pack("<IIQI", 0x07064B50, 0, end, 1)
    saturated = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, *(0xFFFF,) * 2, *(0xFFFFFFFF,) * 2, 0)
    return raw[:end] + record + locator + saturated


def test_zip64_end_records_on_a_small_archive() -> None:
    raw = with_zip64_end_records(sample())
    assert read_all(raw) == read_all(sample())
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        assert archive.read("model/a.txt") == TEXT


_FUZZ_SAMPLE = build(
    ("model/a.txt", TEXT[:3000], DEFLATED),
    ("model/b.bin", TEXT[:3000], ZSTD),
    ("model/c", b"stored bytes", STORED),
)
FUZZ_BASES = [_FUZZ_SAMPLE, with_zip64_end_records(_FUZZ_SAMPLE)]


@settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    base=st.sampled_from(FUZZ_BASES),
    mutations=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=8
    ),
    keep=st.one_of(st.none(), st.floats(0, 1)),
)
@pytest.mark.slow
def test_mutated_zip_reads_or_raises_invalid_carton(
    base: bytes, mutations: list[tuple[int, int]], keep: float | None
) -> None:
    data = bytearray(base)
    for position, value in mutations:
        data[position % len(data)] = value
    mutated = bytes(data if keep is None else data[: int(len(data) * keep)])
    try:
        result = read_all(mutated)
    except InvalidCarton as error:
        assert error.file and str(error).startswith(f"{error.file}: ")
    else:
        # Whatever survived must be exactly what was declared (CRC-checked).
        with ZipReader(io.BytesIO(mutated)) as reader:
            declared = {entry.name: entry.uncompressed_size for entry in reader.entries}
        assert {name: len(content) for name, content in result.items()} == declared
