"""A strict, streaming zip reader and writer for cartons.

Written by hand rather than on ``zipfile`` because cartons use zstd
(method 93), which ``zipfile`` cannot decode, and because a store that takes
archives from the network needs hard limits: entry counts, sizes, ratios,
overlapping entries. Every malformed or hostile archive raises
``cartonstore.errors.InvalidCarton`` naming the entry (or ``"zip"``).
"""

from cartonstore.zipfmt.central import (
    LOCAL_HEADER_FIXED,
    TAIL_READ_SIZE,
    CentralDirectoryLocation,
    ZipEntry,
    ZipLimits,
    check_directory_limits,
    check_entry_limits,
    check_no_overlap,
    local_header_length,
    local_header_variable_length,
    locate_central_directory,
    parse_central_directory,
)
from cartonstore.zipfmt.decode import Decoder, make_decoder
from cartonstore.zipfmt.entry_decoder import EntryDecoder
from cartonstore.zipfmt.reader import EntryStream, ZipReader
from cartonstore.zipfmt.writer import (
    COMPRESSION_METHODS,
    DEFLATED,
    STORED,
    ZSTD,
    ZipWriter,
)

__all__ = [
    "COMPRESSION_METHODS",
    "DEFLATED",
    "LOCAL_HEADER_FIXED",
    "STORED",
    "TAIL_READ_SIZE",
    "ZSTD",
    "CentralDirectoryLocation",
    "Decoder",
    "EntryDecoder",
    "EntryStream",
    "ZipEntry",
    "ZipLimits",
    "ZipReader",
    "ZipWriter",
    "check_directory_limits",
    "check_entry_limits",
    "check_no_overlap",
    "local_header_length",
    "local_header_variable_length",
    "locate_central_directory",
    "make_decoder",
    "parse_central_directory",
]
