"""Follow the frame and block structure of a zstd stream (RFC 8878, section 3).

python-zstandard's streaming decompressor returns *all* the output of the
input it is given, and a few bytes of zstd can stand for 128 KiB of output
(an RLE block), so a 1 MiB chunk of a hostile stream could expand to ~32 GiB
in one call. Walking the block headers (cheap: 3 bytes per block) tells us
how far we can feed the decompressor before it may produce more than a
budget, and whether the stream stopped in the middle of a frame.
"""

from __future__ import annotations

from collections.abc import Callable

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MAGIC = 0x184D2A50  # the low 4 bits are free
MAX_BLOCK_OUTPUT = 128 * 1024

_RLE_BLOCK = 1
_COMPRESSED_BLOCK = 2
_RESERVED_BLOCK = 3


class ZstdFormatError(ValueError):
    """The bytes do not follow the zstd frame format."""


class FrameScanner:
    """Tracks where a zstd stream is in its frames as bytes pass by.

    The scanner is always either passing over ``_skip`` bytes (block bodies,
    optional header fields, checksums) or collecting a ``_want``-byte header
    that ``_parse`` then reads. Headers may straddle input chunks.
    """

    def __init__(self) -> None:
        self._skip = 0
        self._want = 4
        self._parse: Callable[[bytes], int] = self._on_magic
        self._header = bytearray()
        self._checksum_length = 0

    @property
    def at_frame_boundary(self) -> bool:
        """True between frames: the stream may end here without being truncated."""
        return self._parse == self._on_magic and not self._header and not self._skip

    def advance(self, data: memoryview | bytes, budget: int) -> int:
        """Consume a prefix of ``data`` that decodes to at most about ``budget`` bytes.

        Returns the prefix length: it ends before the first block that would
        take the output of the prefix past ``budget``, though it always
        includes at least one block. Raises ``ZstdFormatError`` on a bad
        magic number, reserved bits or a reserved block type.
        """
        pos, promised = 0, 0
        while pos < len(data):
            if self._skip:
                step = min(self._skip, len(data) - pos)
                self._skip -= step
                pos += step
                continue
            if promised >= budget and self._starts_block():
                break
            step = min(self._want - len(self._header), len(data) - pos)
            self._header += data[pos : pos + step]
            pos += step
            if len(self._header) == self._want:
                header = bytes(self._header)
                self._header.clear()
                promised += self._parse(header)
        return pos

    def _starts_block(self) -> bool:
        return self._parse == self._on_block_header and not self._header

    def _on_magic(self, header: bytes) -> int:
        magic = int.from_bytes(header, "little")
        if magic == ZSTD_MAGIC:
            self._want, self._parse = 1, self._on_frame_descriptor
        elif magic & 0xFFFFFFF0 == SKIPPABLE_MAGIC:
            self._want, self._parse = 4, self._on_skippable_size
        else:
            raise ZstdFormatError(f"bad zstd frame magic number 0x{magic:08x}")
        return 0

    def _on_skippable_size(self, header: bytes) -> int:
        self._skip = int.from_bytes(header, "little")
        self._want, self._parse = 4, self._on_magic
        return 0

    def _on_frame_descriptor(self, header: bytes) -> int:
        descriptor = header[0]
        if descriptor & 0x08:
            raise ZstdFormatError("zstd frame header has its reserved bit set")
        single_segment = descriptor >> 5 & 1
        content_size_length = (single_segment, 2, 4, 8)[descriptor >> 6]
        dictionary_id_length = (0, 1, 2, 4)[descriptor & 3]
        window_descriptor_length = 1 - single_segment
        self._skip = window_descriptor_length + dictionary_id_length + content_size_length
        self._checksum_length = 4 if descriptor & 0x04 else 0
        self._want, self._parse = 3, self._on_block_header
        return 0

    def _on_block_header(self, header: bytes) -> int:
        word = int.from_bytes(header, "little")
        is_last, block_type, size = word & 1, word >> 1 & 3, word >> 3
        if block_type == _RESERVED_BLOCK:
            raise ZstdFormatError("zstd block has the reserved block type")
        # An RLE block's size is its output size; its body is the one byte.
        self._skip = 1 if block_type == _RLE_BLOCK else size
        if is_last:
            self._skip += self._checksum_length
            self._want, self._parse = 4, self._on_magic
        return MAX_BLOCK_OUTPUT if block_type == _COMPRESSED_BLOCK else size
