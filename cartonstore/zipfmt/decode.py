"""Streaming decoders for the compression methods of zip entries.

Every decoder returns bounded output: ``decode(chunk, max_length)`` never
returns more than ``max_length`` bytes and never holds more than a few
hundred KiB beyond that, however well the input compresses. That is what
lets the reader stop a zip bomb after at most one chunk past its declared
size. The contract mirrors ``bz2.BZ2Decompressor``:

    decoder = make_decoder(method, name)
    for chunk in compressed_chunks:
        out = decoder.decode(chunk, max_length)
        ...use out...
        while not decoder.needs_input:
            out = decoder.decode(b"", max_length)
            ...use out...
    decoder.finish()

zlib.error and zstandard.ZstdError are translated into ``InvalidCarton``
naming the entry; they never escape this module.
"""

from __future__ import annotations

import zlib

import zstandard

from cartonstore.errors import InvalidCarton

from .layout import DEFLATED, STORED, ZSTD
from .zstdframe import FrameScanner, ZstdFormatError

DEFAULT_MAX_LENGTH = 1 << 20

# libzstd's own default limit (128 MiB). A frame asking for a larger window
# (zstd --long=31) is refused rather than allowed to take gigabytes of RAM.
MAX_ZSTD_WINDOW = 1 << 27


class Decoder:
    """Base of the decoders: input in, at most ``max_length`` bytes out per call.

    Subclasses implement ``_feed`` (take new input), ``_step`` (decode some
    of it), ``_has_more`` (more output may come without new input) and
    ``_check_complete`` (the stream ended properly).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._output = b""
        self._fed = False

    @property
    def needs_input(self) -> bool:
        """True once everything fed so far has been decoded and returned."""
        return not self._output and not self._has_more()

    def decode(self, chunk: bytes = b"", max_length: int = DEFAULT_MAX_LENGTH) -> bytes:
        """Feed ``chunk`` (if any) and return up to ``max_length`` decoded bytes.

        New input is only accepted when ``needs_input`` is True; drain with
        ``decode(b"", max_length)`` until it is. Raises ``InvalidCarton`` if
        the data is corrupt, ``ValueError`` on misuse.
        """
        if max_length < 1:
            raise ValueError("max_length must be at least 1")
        if chunk:
            if not self.needs_input:
                raise ValueError("decode() was given new input before draining the last")
            self._fed = True
            self._feed(chunk)
        if not self._output:
            self._output = self._step(max_length)
        out, self._output = self._output[:max_length], self._output[max_length:]
        return out

    def finish(self) -> None:
        """Declare the end of the input.

        Raises ``InvalidCarton`` if the compressed stream stopped before its
        end (truncated data). An empty input is accepted as empty content:
        some writers store nothing at all for an empty file.
        """
        if not self.needs_input:
            raise ValueError("finish() called before the decoder was drained")
        if self._fed:
            self._check_complete()

    def _feed(self, chunk: bytes) -> None:
        raise NotImplementedError

    def _step(self, max_length: int) -> bytes:
        raise NotImplementedError

    def _has_more(self) -> bool:
        raise NotImplementedError

    def _check_complete(self) -> None:
        raise NotImplementedError


class StoredDecoder(Decoder):
    """Method 0: the data is the content."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._input = memoryview(b"")

    def _feed(self, chunk: bytes) -> None:
        self._input = memoryview(chunk)

    def _step(self, max_length: int) -> bytes:
        out, self._input = self._input[:max_length], self._input[max_length:]
        return bytes(out)

    def _has_more(self) -> bool:
        return bool(self._input)

    def _check_complete(self) -> None:
        return None


class DeflateDecoder(Decoder):
    """Method 8: raw deflate, bounded by zlib's own ``max_length``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        self._input = b""
        # zlib may hold output back when a call stops at max_length, even
        # with no input left; one more call with no input releases it.
        self._maybe_more = False

    def _feed(self, chunk: bytes) -> None:
        if self._zlib.eof:
            raise InvalidCarton(
                self.name, "compressed data continues past the end of the deflate stream"
            )
        self._input = chunk

    def _step(self, max_length: int) -> bytes:
        try:
            out = self._zlib.decompress(self._input, max_length)
        except zlib.error as error:
            raise InvalidCarton(self.name, f"corrupt deflate data ({error})") from None
        self._input = self._zlib.unconsumed_tail
        self._maybe_more = len(out) == max_length and not self._zlib.eof
        if self._zlib.unused_data:
            raise InvalidCarton(
                self.name, "compressed data continues past the end of the deflate stream"
            )
        return out

    def _has_more(self) -> bool:
        return bool(self._input) or self._maybe_more

    def _check_complete(self) -> None:
        if not self._zlib.eof:
            raise InvalidCarton(self.name, "deflate data is truncated (the stream does not end)")


class ZstdDecoder(Decoder):
    """Method 93: one or more zstd frames (skippable frames allowed).

    python-zstandard's ``decompressobj`` has no ``max_length``, so the frame
    scanner decides how much input to hand it at a time; see zstdframe.py.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
        self._zstd = decompressor.decompressobj(read_across_frames=True)
        self._frames = FrameScanner()
        self._input = memoryview(b"")

    def _feed(self, chunk: bytes) -> None:
        self._input = memoryview(chunk)

    def _step(self, max_length: int) -> bytes:
        try:
            cut = self._frames.advance(self._input, max_length)
            piece, self._input = self._input[:cut], self._input[cut:]
            return self._zstd.decompress(piece)
        except (ZstdFormatError, zstandard.ZstdError) as error:
            raise InvalidCarton(self.name, f"corrupt zstd data ({error})") from None

    def _has_more(self) -> bool:
        return bool(self._input)

    def _check_complete(self) -> None:
        if not self._frames.at_frame_boundary:
            raise InvalidCarton(self.name, "zstd data is truncated (a frame does not end)")


_DECODERS: dict[int, type[Decoder]] = {
    STORED: StoredDecoder,
    DEFLATED: DeflateDecoder,
    ZSTD: ZstdDecoder,
}


def make_decoder(method: int, name: str = "zip") -> Decoder:
    """A fresh decoder for ``method`` whose errors name the entry ``name``.

    Raises ``InvalidCarton(name, ...)`` for a method other than stored (0),
    deflate (8) or zstd (93).
    """
    try:
        return _DECODERS[method](name)
    except KeyError:
        raise InvalidCarton(name, f"unsupported compression method {method}") from None
