"""Binary layouts of the zip records we read and write (APPNOTE.TXT 6.3.10).

Shared by the parser and the writer so that both agree on every field. All
integers are little-endian; the fixed part of each record is a ``struct.Struct``
whose size is the record's fixed length.
"""

from __future__ import annotations

import struct

LOCAL_HEADER_SIG = 0x04034B50
CENTRAL_HEADER_SIG = 0x02014B50
EOCD_SIG = 0x06054B50
ZIP64_EOCD_SIG = 0x06064B50
ZIP64_LOCATOR_SIG = 0x07064B50

ZIP64_EXTRA_ID = 0x0001

# A 16- or 32-bit field holding this value means "see the zip64 record".
MAX_U16 = 0xFFFF
MAX_U32 = 0xFFFFFFFF

# sig, version needed, flags, method, time, date, crc32, compressed size,
# uncompressed size, name length, extra length
LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")

# sig, version made by, version needed, flags, method, time, date, crc32,
# compressed size, uncompressed size, name length, extra length,
# comment length, disk number start, internal attr, external attr,
# local header offset
CENTRAL_HEADER = struct.Struct("<IHHHHHHIIIHHHHHII")

# sig, this disk, disk with central directory, entries on this disk,
# total entries, central directory size, central directory offset,
# comment length
EOCD = struct.Struct("<IHHHHIIH")

# sig, disk holding the zip64 end record, its offset, total disks
ZIP64_LOCATOR = struct.Struct("<IIQI")

# sig, size of the rest of the record, version made by, version needed,
# this disk, disk with central directory, entries on this disk,
# total entries, central directory size, central directory offset
ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")

# header id, data size
EXTRA_HEADER = struct.Struct("<HH")

# Bytes of the zip64 end record counted by its own "size" field.
ZIP64_EOCD_BODY = ZIP64_EOCD.size - 12

FLAG_ENCRYPTED = 0x0001
FLAG_STRONG_ENCRYPTION = 0x0040
FLAG_UTF8 = 0x0800
FLAG_MASKED_HEADERS = 0x2000

UNIX = 3
S_IFMT = 0o170000
S_IFLNK = 0o120000
S_IFREG = 0o100000

# Compression methods we read and write (APPNOTE 4.4.5; 93 is zstd).
STORED = 0
DEFLATED = 8
ZSTD = 93
SUPPORTED_METHODS = frozenset({STORED, DEFLATED, ZSTD})
