"""Parse a zip's central directory and local headers (its end records: end_records.py).

Pure functions: bytes in, value objects or ``InvalidCarton`` out, no I/O, so
everything here can be fuzzed without files. The reader decides what to read
and calls these on the bytes it got.

The parser is strict on purpose. A zip that two tools could read differently
(a local name that differs from the central one, data that overlaps another
entry, a central directory that does not sit right before its end record) is
an attack surface rather than a compatibility matter, so it is refused with a
message that says what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from cartonstore.errors import InvalidCarton

from .end_records import ARCHIVE, CentralDirectoryLocation, check_directory_limits
from .layout import (
    CENTRAL_HEADER,
    CENTRAL_HEADER_SIG,
    EXTRA_HEADER,
    FLAG_ENCRYPTED,
    FLAG_MASKED_HEADERS,
    FLAG_STRONG_ENCRYPTION,
    FLAG_UTF8,
    LOCAL_HEADER,
    LOCAL_HEADER_SIG,
    MAX_U16,
    MAX_U32,
    S_IFLNK,
    S_IFMT,
    STORED,
    SUPPORTED_METHODS,
    UNIX,
    ZIP64_EXTRA_ID,
)
from .limits import ZipLimits

LOCAL_HEADER_FIXED = LOCAL_HEADER.size

_METHOD_NAMES = {
    1: "shrink",
    6: "implode",
    9: "deflate64",
    12: "bzip2",
    14: "lzma",
    95: "xz",
    98: "ppmd",
    99: "WinZip AES encryption",
}

# In the order APPNOTE 4.5.3 lays them out in the zip64 extra field, each
# present only when its regular field holds the saturated value.
_ZIP64_FIELDS = (
    ("uncompressed size", 8, MAX_U32),
    ("compressed size", 8, MAX_U32),
    ("local header offset", 8, MAX_U32),
    ("disk number", 4, MAX_U16),
)


@dataclass(frozen=True)
class ZipEntry:
    """One central directory record, with zip64 values already applied."""

    name: str
    method: int
    flags: int
    crc32: int
    compressed_size: int
    uncompressed_size: int
    local_header_offset: int
    external_attr: int
    create_system: int

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")

    @property
    def is_symlink(self) -> bool:
        return self.create_system == UNIX and (self.external_attr >> 16) & S_IFMT == S_IFLNK

    @property
    def unix_mode(self) -> int | None:
        """The st_mode (type and permission bits), or None if none was recorded."""
        mode = self.external_attr >> 16
        return mode if self.create_system == UNIX and mode else None

    @property
    def raw_name(self) -> bytes:
        """The name as stored in the archive (the local header must match it)."""
        return self.name.encode("utf-8" if self.flags & FLAG_UTF8 else "cp437")


def parse_central_directory(
    data: bytes, location: CentralDirectoryLocation, limits: ZipLimits
) -> list[ZipEntry]:
    """Parse exactly ``location.entry_count`` records from ``data``.

    ``data`` is the whole central directory (``location.size`` bytes). Raises
    ``InvalidCarton`` for too many entries, truncation, trailing garbage, bad
    names (NUL, invalid UTF-8, empty), encryption, unsupported methods and
    malformed zip64 fields. Path safety is not checked here.
    """
    check_directory_limits(location, limits)
    count = location.entry_count
    if len(data) != location.size:
        raise InvalidCarton(
            ARCHIVE,
            f"central directory truncated: expected {location.size} bytes, got {len(data)}",
        )
    entries: list[ZipEntry] = []
    pos = 0
    for index in range(count):
        record = _parse_record(data, pos, index)
        if record is None:
            raise InvalidCarton(
                ARCHIVE, f"central directory truncated: expected {count} entries, found {index}"
            )
        entry, pos = record
        entries.append(entry)
    if pos != len(data):
        raise InvalidCarton(
            ARCHIVE,
            f"central directory has {len(data) - pos} unexpected bytes after its {count} entries",
        )
    return entries


def _parse_record(data: bytes, pos: int, index: int) -> tuple[ZipEntry, int] | None:
    """The entry at ``pos`` and where the next begins, or None if it is cut short."""
    if pos + CENTRAL_HEADER.size > len(data):
        return None
    (sig, made_by, _, flags, method, _, _, crc, csize, usize, name_length, extra_length,
     comment_length, disk, _, external_attr, offset) = CENTRAL_HEADER.unpack_from(data, pos)  # fmt: skip
    if sig != CENTRAL_HEADER_SIG:
        raise InvalidCarton(
            ARCHIVE, f"central directory record {index + 1} is corrupt (bad signature)"
        )
    name_at = pos + CENTRAL_HEADER.size
    extra_at = name_at + name_length
    end = extra_at + extra_length + comment_length
    if end > len(data):
        return None
    name = _decode_name(data[name_at:extra_at], flags, index)
    extra = data[extra_at : extra_at + extra_length]
    usize, csize, offset, disk = _apply_zip64(name, extra, (usize, csize, offset, disk))
    entry = ZipEntry(name, method, flags, crc, csize, usize, offset, external_attr, made_by >> 8)
    _check_entry(entry, disk)
    return entry, end


def _decode_name(raw: bytes, flags: int, index: int) -> str:
    where = f"central directory record {index + 1}"
    if flags & FLAG_UTF8:
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidCarton(ARCHIVE, f"{where}: name {raw!r} is not valid UTF-8") from None
    else:
        # Without the UTF-8 flag APPNOTE says the name is IBM code page 437.
        name = raw.decode("cp437")
    if not name:
        raise InvalidCarton(ARCHIVE, f"{where}: entry has an empty name")
    if "\x00" in name:
        raise InvalidCarton(ARCHIVE, f"{where}: entry name {name!r} contains a NUL byte")
    return name


def _apply_zip64(name: str, extra: bytes, values: tuple[int, ...]) -> tuple[int, ...]:
    if MAX_U32 not in values[:3] and values[3] != MAX_U16:
        return values  # the common case, kept cheap for archives of many entries
    body = _find_extra(name, extra, ZIP64_EXTRA_ID) or b""
    result, pos = [], 0
    for short_value, (what, width, sentinel) in zip(values, _ZIP64_FIELDS, strict=True):
        if short_value != sentinel:
            result.append(short_value)
            continue
        if pos + width > len(body):
            raise InvalidCarton(name, f"zip64 extra field is missing or lacks the {what}")
        result.append(int.from_bytes(body[pos : pos + width], "little"))
        pos += width
    return tuple(result)


def _find_extra(name: str, extra: bytes, wanted: int) -> bytes | None:
    found = None
    pos = 0
    while pos < len(extra):
        if pos + EXTRA_HEADER.size > len(extra):
            raise InvalidCarton(name, "extra field is malformed (truncated header)")
        header_id, size = EXTRA_HEADER.unpack_from(extra, pos)
        body = extra[pos + EXTRA_HEADER.size : pos + EXTRA_HEADER.size + size]
        if len(body) != size:
            raise InvalidCarton(name, f"extra field 0x{header_id:04x} runs past the extra data")
        if header_id == wanted:
            if found is not None:
                # Two copies could be read differently by two tools.
                raise InvalidCarton(name, f"extra field 0x{wanted:04x} appears twice")
            found = body
        pos += EXTRA_HEADER.size + size
    return found


def _check_entry(entry: ZipEntry, disk: int) -> None:
    if disk != 0:
        raise InvalidCarton(
            entry.name, f"starts on disk {disk}; multi-disk archives are not supported"
        )
    if entry.flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_HEADERS):
        raise InvalidCarton(entry.name, "is encrypted; encrypted entries are not supported")
    if entry.method not in SUPPORTED_METHODS:
        label = _METHOD_NAMES.get(entry.method)
        method = f"{entry.method} ({label})" if label else str(entry.method)
        raise InvalidCarton(
            entry.name,
            f"uses compression method {method}; only stored (0), deflate (8) "
            "and zstd (93) are supported",
        )
    if entry.method == STORED and entry.compressed_size != entry.uncompressed_size:
        raise InvalidCarton(
            entry.name,
            f"is stored uncompressed but declares {entry.compressed_size} bytes of data "
            f"for a size of {entry.uncompressed_size} bytes",
        )


def check_entry_limits(entry: ZipEntry, limits: ZipLimits) -> None:
    """Refuse an entry whose declared sizes exceed ``limits``.

    Raises ``InvalidCarton(entry.name, ...)`` for a size over
    ``max_entry_size`` or a ratio over ``max_ratio`` (zip bomb).
    """
    size, compressed = entry.uncompressed_size, entry.compressed_size
    if size > limits.max_entry_size:
        raise InvalidCarton(
            entry.name, f"declared size {size} bytes exceeds the limit of {limits.max_entry_size}"
        )
    if size >= limits.ratio_floor and size > compressed * limits.max_ratio:
        raise InvalidCarton(
            entry.name,
            f"compression ratio too high: {compressed} bytes would decode to {size} "
            f"(more than {limits.max_ratio}:1), a likely zip bomb",
        )


def check_no_overlap(spans: list[tuple[ZipEntry, int, int]], cd_offset: int) -> None:
    """Refuse entries whose bytes overlap each other or the central directory.

    Each span is (entry, start, end): from its local header to the end of
    its compressed data. Overlapping entries let a small file expand to a
    huge total (the "overlapping files" zip bomb). Raises ``InvalidCarton``
    naming the later entry.
    """
    previous: tuple[ZipEntry, int, int] | None = None
    for entry, start, end in sorted(spans, key=lambda span: (span[1], span[2])):
        if end > cd_offset:
            raise InvalidCarton(
                entry.name,
                f"data (bytes {start}-{end}) runs into the central directory at byte {cd_offset}",
            )
        if previous is not None and start < previous[2]:
            other, other_start, other_end = previous
            raise InvalidCarton(
                entry.name,
                f"overlaps entry {other.name!r} (bytes {start}-{end} and "
                f"{other_start}-{other_end}); overlapping entries are a zip bomb technique",
            )
        previous = (entry, start, end)


def local_header_lengths(fixed30: bytes, file: str = ARCHIVE, offset: int | None = None) -> tuple[int, int]:
    """(name length, extra field length) of a local header's fixed part.

    Raises ``InvalidCarton(file, ...)`` if ``fixed30`` is short or is not a
    local file header (naming ``offset``, where given).
    """
    fields = _local_header_fields(fixed30, file, offset)
    return fields[9], fields[10]


def local_header_length(data: bytes, entry: ZipEntry) -> int:
    """Total length of ``entry``'s local header: its data starts this far in.

    ``data`` starts at the local header and holds at least its fixed part
    and name. Raises ``InvalidCarton(entry.name, ...)`` if the header is
    missing or truncated, or if its name or method disagree with the
    central directory (two tools could then see two different archives).
    """
    fields = _local_header_fields(data, entry.name, entry.local_header_offset)
    method, name_length, extra_length = fields[3], fields[9], fields[10]
    expected = entry.raw_name
    if name_length == len(expected) and len(data) < LOCAL_HEADER_FIXED + name_length:
        raise InvalidCarton(entry.name, "local file header is truncated")
    local_name = data[LOCAL_HEADER_FIXED : LOCAL_HEADER_FIXED + name_length]
    if local_name != expected:
        raise InvalidCarton(
            entry.name, f"local header names it {local_name!r}, unlike the central directory"
        )
    if method != entry.method:
        raise InvalidCarton(
            entry.name,
            f"local header says compression method {method}, "
            f"the central directory says {entry.method}",
        )
    return LOCAL_HEADER_FIXED + name_length + extra_length


def _local_header_fields(data: bytes, file: str, offset: int | None = None) -> tuple[int, ...]:
    where = "" if offset is None else f" at offset {offset}"
    if len(data) < LOCAL_HEADER_FIXED:
        raise InvalidCarton(file, f"local file header{where} is truncated")
    fields = LOCAL_HEADER.unpack_from(data, 0)
    if fields[0] != LOCAL_HEADER_SIG:
        raise InvalidCarton(file, f"no local file header{where} (bad signature)")
    return fields
