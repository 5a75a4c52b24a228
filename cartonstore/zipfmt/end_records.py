"""Find a zip's central directory from its end records (APPNOTE 4.3.14-16):
the end of central directory record, and in a zip64 archive the zip64 end
record and its locator. Pure functions, like central.py: bytes in, a
location or ``InvalidCarton`` out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cartonstore.errors import InvalidCarton

from .layout import (
    CENTRAL_HEADER,
    EOCD,
    EOCD_SIG,
    MAX_U16,
    ZIP64_EOCD,
    ZIP64_EOCD_SIG,
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_SIG,
)
from .limits import ZipLimits

ARCHIVE = "zip"
"""The ``file`` of errors about the archive as a whole rather than one entry."""

# The EOCD is followed by a comment of up to 64 KiB, and in a zip64 archive
# preceded by the zip64 locator and the zip64 end record.
TAIL_READ_SIZE = EOCD.size + MAX_U16 + ZIP64_LOCATOR.size + ZIP64_EOCD.size


@dataclass(frozen=True)
class CentralDirectoryLocation:
    """Where the central directory is (absolute offset) and what it holds."""

    offset: int
    size: int
    entry_count: int


def locate_central_directory(tail: bytes, tail_offset: int) -> CentralDirectoryLocation:
    """Find the central directory from the last bytes of a zip file.

    ``tail`` must end at the end of the file (read ``TAIL_READ_SIZE`` bytes,
    or the whole file if smaller); ``tail_offset`` is the file offset of
    ``tail[0]``. Raises ``InvalidCarton("zip", ...)`` when there is no end
    record, the archive spans several disks, its counts disagree, or the
    central directory does not end right where the end records begin.
    """
    pos = _find_eocd(tail)
    _, disk, cd_disk, disk_entries, total, cd_size, cd_offset, _ = EOCD.unpack_from(tail, pos)
    zip64_offset = _zip64_record_offset(tail, pos)
    if zip64_offset is None:
        _check_single_disk(disk, cd_disk, disk_entries, total)
        location, end = CentralDirectoryLocation(cd_offset, cd_size, total), tail_offset + pos
    else:
        locator_at = tail_offset + pos - ZIP64_LOCATOR.size
        location = _parse_zip64_end(tail, tail_offset, zip64_offset, locator_at)
        end = zip64_offset
    _check_location(location, end)
    return location


def _find_eocd(tail: bytes) -> int:
    # Scan backwards: the real record is the last one whose comment runs
    # exactly to the end of the file (a comment may itself contain "PK\5\6").
    signature = struct.pack("<I", EOCD_SIG)
    highest = len(tail) - EOCD.size
    lowest = max(0, highest - MAX_U16)
    pos = tail.rfind(signature, lowest, highest + 4) if highest >= 0 else -1
    while pos >= 0:
        (comment_length,) = struct.unpack_from("<H", tail, pos + EOCD.size - 2)
        if pos + EOCD.size + comment_length == len(tail):
            return pos
        pos = tail.rfind(signature, lowest, pos + 3)
    raise InvalidCarton(
        ARCHIVE, "not a zip file, or truncated: no end of central directory record found"
    )


def _zip64_record_offset(tail: bytes, eocd_pos: int) -> int | None:
    at = eocd_pos - ZIP64_LOCATOR.size
    if at < 0 or tail[at : at + 4] != struct.pack("<I", ZIP64_LOCATOR_SIG):
        return None
    _, disk, record_offset, disks = ZIP64_LOCATOR.unpack_from(tail, at)
    if disk != 0 or disks > 1:
        raise InvalidCarton(ARCHIVE, "multi-disk (split) archives are not supported")
    return int(record_offset)


def _parse_zip64_end(
    tail: bytes, tail_offset: int, record_offset: int, locator_at: int
) -> CentralDirectoryLocation:
    at = record_offset - tail_offset
    if at < 0 or record_offset + ZIP64_EOCD.size > locator_at:
        raise InvalidCarton(
            ARCHIVE,
            f"zip64 end of central directory record offset {record_offset} "
            "does not point just before its locator",
        )
    sig, body_size, _, _, disk, cd_disk, disk_entries, total, cd_size, cd_offset = (
        ZIP64_EOCD.unpack_from(tail, at)
    )
    if sig != ZIP64_EOCD_SIG or record_offset + 12 + body_size != locator_at:
        raise InvalidCarton(ARCHIVE, "zip64 end of central directory record is corrupt")
    _check_single_disk(disk, cd_disk, disk_entries, total)
    return CentralDirectoryLocation(cd_offset, cd_size, total)


def _check_single_disk(disk: int, cd_disk: int, disk_entries: int, total: int) -> None:
    if disk != 0 or cd_disk != 0:
        raise InvalidCarton(ARCHIVE, "multi-disk (split) archives are not supported")
    if disk_entries != total:
        raise InvalidCarton(
            ARCHIVE,
            f"inconsistent entry counts: {disk_entries} on this disk but {total} in total",
        )


def _check_location(location: CentralDirectoryLocation, end: int) -> None:
    cd_end = location.offset + location.size
    if cd_end > end:
        raise InvalidCarton(
            ARCHIVE,
            f"central directory (offset {location.offset}, {location.size} bytes) runs past "
            f"the end records at offset {end}: the file is truncated or corrupt",
        )
    if cd_end < end:
        raise InvalidCarton(
            ARCHIVE,
            f"{end - cd_end} unexpected bytes between the central directory and "
            "the end records (not a plain zip file)",
        )
    if location.size < location.entry_count * CENTRAL_HEADER.size:
        raise InvalidCarton(
            ARCHIVE,
            f"inconsistent counts: a central directory of {location.size} bytes "
            f"cannot hold {location.entry_count} entries",
        )


def check_directory_limits(location: CentralDirectoryLocation, limits: ZipLimits) -> None:
    """Refuse a central directory too big to read, before reading it.

    Raises ``InvalidCarton("zip", ...)`` naming the limit exceeded.
    """
    if location.entry_count > limits.max_entries:
        raise InvalidCarton(
            ARCHIVE,
            f"has {location.entry_count} entries; the limit is {limits.max_entries}",
        )
    if location.size > limits.max_central_directory_size:
        raise InvalidCarton(
            ARCHIVE,
            f"central directory is {location.size} bytes; "
            f"the limit is {limits.max_central_directory_size}",
        )
