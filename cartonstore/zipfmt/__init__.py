"""A strict, streaming zip reader and writer for cartons.

Written by hand rather than on ``zipfile`` because cartons use zstd
(method 93), which ``zipfile`` cannot decode, and because a store that takes
archives from the network needs hard limits: entry counts, sizes, ratios,
overlapping entries. Every malformed or hostile archive raises
``cartonstore.errors.InvalidCarton`` naming the entry (or ``"zip"``).
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

# Each name is imported from its module on first use (PEP 562): the settings
# and the store need ZipLimits alone, and must not load the codecs with it
# (zstandard, zlib) so that `cartonstore path` starts fast.
_MODULE_NAMES = {
    "limits": "ZipLimits",
    "end_records": "TAIL_READ_SIZE CentralDirectoryLocation check_directory_limits locate_central_directory",
    "central": "LOCAL_HEADER_FIXED ZipEntry check_entry_limits check_no_overlap local_header_length "
               "local_header_lengths parse_central_directory",
    "decode": "Decoder make_decoder",
    "entry_decoder": "EntryDecoder",
    "reader": "EntryStream ZipReader",
    "writer": "COMPRESSION_METHODS DEFLATED STORED ZSTD ZipWriter",
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _MODULE_NAMES)

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .central import (
        LOCAL_HEADER_FIXED,
        ZipEntry,
        check_entry_limits,
        check_no_overlap,
        local_header_length,
        local_header_lengths,
        parse_central_directory,
    )
    from .decode import Decoder, make_decoder
    from .end_records import (
        TAIL_READ_SIZE,
        CentralDirectoryLocation,
        check_directory_limits,
        locate_central_directory,
    )
    from .entry_decoder import EntryDecoder
    from .limits import ZipLimits
    from .reader import EntryStream, ZipReader
    from .writer import COMPRESSION_METHODS, DEFLATED, STORED, ZSTD, ZipWriter
