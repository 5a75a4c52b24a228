"""Push-style decoding of one zip entry, for bytes that arrive from a network.

The same checks as EntryStream (the pull-style reader of local files): the
decoded size may never pass the declared size, and at the end size and
CRC-32 must match the central directory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from cartonstore.errors import InvalidCarton

from .central import ZipEntry
from .decode import DEFAULT_MAX_LENGTH, make_decoder


class EntryDecoder:
    def __init__(self, entry: ZipEntry) -> None:
        self.entry = entry
        self.decoder = make_decoder(entry.method, entry.name)
        self.decoded = 0
        self._crc = 0

    def feed(self, compressed: bytes) -> Iterator[bytes]:
        """Decoded pieces of at most 1 MiB; raises InvalidCarton on a lie."""
        out = self.decoder.decode(compressed, self._limit())
        while True:
            if out:
                self.account(out)
                yield out
            if self.decoder.needs_input:
                return
            out = self.decoder.decode(b"", self._limit())

    def _limit(self) -> int:
        # One byte past the declared size is enough to detect a lie.
        return max(1, min(DEFAULT_MAX_LENGTH, self.entry.uncompressed_size - self.decoded + 1))

    def account(self, out: bytes) -> None:
        """Count decoded bytes (for pull-style readers too)."""
        self.decoded += len(out)
        if self.decoded > self.entry.uncompressed_size:
            raise InvalidCarton(self.entry.name,
                                f"declared size {self.entry.uncompressed_size} bytes but it decodes to more")
        self._crc = zlib.crc32(out, self._crc)

    def finish(self) -> None:
        self.decoder.finish()
        if self.decoded != self.entry.uncompressed_size:
            raise InvalidCarton(self.entry.name, f"declared size {self.entry.uncompressed_size} bytes "
                                                 f"but it decodes to only {self.decoded}")
        if self._crc != self.entry.crc32:
            raise InvalidCarton(self.entry.name, f"CRC-32 mismatch: the central directory says "
                                                 f"{self.entry.crc32:08x}, the content has {self._crc:08x} "
                                                 "(corrupt data)")
