"""Streaming, bounded decoding of HTTP Content-Encoding (RFC 9110, 8.4).

A server may compress a response body with zstd, br, gzip or deflate, and
may stack codings ("gzip, zstd" = gzip applied first, then zstd). Digests
are of the *decoded* bytes, so every body passes through a ContentDecoder:

    decoder = ContentDecoder(parse_content_encoding(header, url=url), url=url,
                             max_output=expected_size)
    for chunk in body:
        for piece in decoder.feed(chunk):   # each piece <= 1 MiB
            hasher.update(piece); file.write(piece)
    decoder.finish()                        # the streams ended properly

Nothing here does I/O. A hostile server is the threat model: every stage
produces at most 1 MiB per step however well its input compresses, the
decoded total is capped (``max_output``) and so is the expansion ratio
(``max_ratio``), and a body that stops inside a stream, or goes on after it,
is refused. zlib.error, brotli.error and zstd errors become FetchError
(retryable=False: asking again gets the same bytes) naming the URL; nothing
else escapes except ValueError on misuse.

An empty body is accepted as empty content whatever the coding (as curl and
browsers do, and as servers send for empty files); the digest check catches
a body that should not have been empty.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

import brotli

from cartonstore.errors import FetchError, InvalidCarton
from cartonstore.zipfmt import STORED, ZSTD, Decoder, make_decoder

from .codings import DEFAULT_ACCEPT_ENCODING, PIECE_SIZE, SUPPORTED_CODINGS
from .policy import describe

MAX_STACKED_CODINGS = 2
"""Real servers apply one coding, rarely two (a pre-compressed file served
through a compressing proxy). More is only ever a way to multiply work."""

_ALIASES = {"x-gzip": "gzip"}  # RFC 9110, 8.4.1.3


def parse_content_encoding(value: str | None, *, url: str) -> tuple[str, ...]:
    """The codings of a Content-Encoding header in the order they were applied.

    Names are lowercased, "x-gzip" becomes "gzip", "identity" and empty
    items are dropped, so a missing or empty header gives ``()``. Raises
    FetchError for a coding not in SUPPORTED_CODINGS or for more than
    MAX_STACKED_CODINGS of them.
    """
    return _normalize((value or "").split(","), url=url)


def _normalize(codings: Sequence[str], *, url: str) -> tuple[str, ...]:
    names = [_ALIASES.get(name, name) for name in (c.strip().lower() for c in codings)]
    names = [name for name in names if name and name != "identity"]
    for name in names:
        if name not in SUPPORTED_CODINGS:
            raise FetchError(
                f"unsupported Content-Encoding {name!r} from {describe(url)}; "
                f"supported: {DEFAULT_ACCEPT_ENCODING}",
                subject=url,
            )
    if len(names) > MAX_STACKED_CODINGS:
        raise FetchError(
            f"too many stacked Content-Encodings ({', '.join(names)}; at most "
            f"{MAX_STACKED_CODINGS}) from {describe(url)}",
            subject=url,
        )
    return tuple(names)


class DecodedTooLarge(FetchError):
    """A body that decodes past max_output or the ratio limit (a bomb)."""


class ContentDecoder:
    """Decodes one response body, chunk by chunk, within hard limits.

    ``encodings`` are in the order the server applied them (as returned by
    parse_content_encoding, or a header value); they are undone in reverse. The decoded total
    may not exceed ``max_output`` (when given), and once it passes
    ``ratio_floor`` it may not exceed ``max_ratio`` times the encoded bytes
    fed so far. The ratio limit applies to the output of every stage, so an
    outer coding cannot hide unbounded work from the inner one either.
    """

    def __init__(self, encodings: Sequence[str], *, url: str, max_output: int | None = None,
                 max_ratio: int = 1000, ratio_floor: int = 64 << 20) -> None:
        self._url = url
        self._max_output = max_output
        self._max_ratio = max_ratio
        self._ratio_floor = ratio_floor
        if isinstance(encodings, str):  # a header value, not a list of names
            encodings = encodings.split(",")
        codings = _normalize(encodings, url=url)
        self._encoded_at_all = bool(codings)
        # No coding still takes a stage: identity counts and splits the chunks.
        self._stages = [_make_stage(coding, url) for coding in reversed(codings or ("identity",))]
        self._produced = [0] * len(self._stages)
        self._encoded = 0

    @property
    def encoded_bytes(self) -> int:
        """Bytes fed so far (the body as it came over the wire)."""
        return self._encoded

    @property
    def decoded_bytes(self) -> int:
        """Bytes yielded so far (the content whose digest counts)."""
        return self._produced[-1]

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """Decode the next chunk of the body, yielding pieces of at most 1 MiB
        (an identity body passes through in the chunks it came in).

        The iterator does the work: exhaust it before the next ``feed`` or
        ``finish``. Raises FetchError (from the iterator) for corrupt data,
        data past the end of a stream or a decompression bomb; the pieces
        yielded before the error stay within the limits.
        """
        if not chunk:
            return
        self._encoded += len(chunk)
        if not self._encoded_at_all:
            # Identity: nothing to bound but the total, and splitting would only copy.
            self._count(0, len(chunk))
            yield chunk
            return
        yield from self._pump(0, chunk)

    def finish(self) -> None:
        """Declare the end of the body; raises FetchError if a stream did not end."""
        for stage in self._stages:
            stage.finish()

    def _pump(self, index: int, data: bytes) -> Iterator[bytes]:
        stage = self._stages[index]
        last = index == len(self._stages) - 1
        while True:
            out = stage.decode(data, PIECE_SIZE)
            data = b""
            if out:
                self._count(index, len(out))
                if last:
                    yield out
                else:
                    yield from self._pump(index + 1, out)
            if stage.needs_input:
                return

    def _count(self, index: int, length: int) -> None:
        # Checked before counting: decoded_bytes only ever counts bytes yielded.
        produced = self._produced[index] + length
        if index == len(self._stages) - 1:
            self._check_total(produced)
        if produced > self._ratio_floor and produced > self._max_ratio * self._encoded:
            raise DecodedTooLarge(
                f"decompression bomb refused: the body from {describe(self._url)} "
                f"expands to more than {self._max_ratio} times its {self._encoded} "
                f"encoded bytes (ratio limit)",
                subject=self._url,
            )
        self._produced[index] = produced

    def _check_total(self, decoded: int) -> None:
        if self._max_output is None or decoded <= self._max_output:
            return
        if not self._encoded_at_all:
            raise DecodedTooLarge(
                f"body from {describe(self._url)} is larger than {self._max_output} bytes",
                subject=self._url,
            )
        raise DecodedTooLarge(
            f"decompression bomb refused: the body from {describe(self._url)} "
            f"decodes to more than {self._max_output} bytes",
            subject=self._url,
        )


def _make_stage(coding: str, url: str) -> Decoder:
    if coding == "identity":
        return make_decoder(STORED, "identity")
    if coding == "zstd":
        return _ZstdStage(url)
    if coding == "br":
        return _BrotliStage(url)
    if coding == "gzip":
        return _GzipStage(url)
    return _DeflateStage(url)


def _truncated(coding: str, url: str) -> FetchError:
    return FetchError(f"body ends inside its {coding} stream: {describe(url)}", subject=url)


def _trailing(coding: str, url: str) -> FetchError:
    return FetchError(
        f"body continues after the end of its {coding} stream: {describe(url)}", subject=url
    )


def _corrupt(coding: str, url: str, detail: object) -> FetchError:
    return FetchError(f"corrupt {coding} data ({detail}) in body of {describe(url)}", subject=url)


class _ZlibStage(Decoder):
    """gzip and deflate: zlib with ``max_length``, one stream object per
    stream. Subclasses say how a stream starts (``_open``)."""

    coding = ""

    def __init__(self, url: str) -> None:
        super().__init__(self.coding)
        self._url = url
        self._zlib: zlib._Decompress | None = None
        self._input = b""
        # zlib may hold output back when a call stops at max_length, even
        # with no input left; one more call with no input releases it.
        self._maybe_more = False

    def _open(self) -> zlib._Decompress | None:
        """A stream object for the input at hand, None until there is enough
        input to tell. Called at the start and after each stream's end."""
        raise NotImplementedError

    def _feed(self, chunk: bytes) -> None:
        self._input += chunk

    def _step(self, max_length: int) -> bytes:
        while True:
            if self._zlib is None or self._zlib.eof:
                if not self._input:
                    return b""
                self._zlib = self._open()
                if self._zlib is None:
                    return b""
            try:
                out = self._zlib.decompress(self._input, max_length)
            except zlib.error as error:
                raise _corrupt(self.coding, self._url, error) from None
            eof = self._zlib.eof
            self._input = self._zlib.unused_data if eof else self._zlib.unconsumed_tail
            self._maybe_more = len(out) == max_length and not eof
            if out or not (eof and self._input):
                return out

    def _has_more(self) -> bool:
        return self._maybe_more or (bool(self._input) and self._zlib is not None)

    def _check_complete(self) -> None:
        if self._zlib is None or not self._zlib.eof or self._input:
            raise _truncated(self.coding, self._url)


class _GzipStage(_ZlibStage):
    """RFC 1952. Several members in a row are one valid body (``cat a.gz
    b.gz``); anything else after a member is refused."""

    coding = "gzip"

    def _open(self) -> zlib._Decompress:
        if self._zlib is not None and not b"\x1f\x8b".startswith(self._input[:2]):
            raise _trailing(self.coding, self._url)
        return zlib.decompressobj(16 + zlib.MAX_WBITS)


class _DeflateStage(_ZlibStage):
    """HTTP "deflate" is zlib-wrapped (RFC 1950), but servers have sent raw
    deflate (RFC 1951) under that name, so the first two bytes decide: a
    valid zlib header (CM = 8, CINFO <= 7, CMF·256 + FLG divisible by 31)
    means zlib, anything else raw deflate."""

    coding = "deflate"

    def _open(self) -> zlib._Decompress | None:
        if self._zlib is not None:
            raise _trailing(self.coding, self._url)
        if len(self._input) < 2:
            return None
        cmf, flg = self._input[0], self._input[1]
        wrapped = cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)


class _BrotliStage(Decoder):
    """RFC 7932, bounded by brotli 1.2's ``output_buffer_limit`` (which may
    overshoot a little; Decoder keeps the excess for the next call).

    ``can_accept_more_data()`` only says the decoder has taken all its input:
    output may still be pending, so a step that returned output is followed
    by another until one returns nothing (or the stream ends).
    """

    def __init__(self, url: str) -> None:
        super().__init__("br")
        self._url = url
        self._brotli = brotli.Decompressor()
        self._input = b""
        self._maybe_more = False

    def _feed(self, chunk: bytes) -> None:
        if self._brotli.is_finished():
            raise _trailing("br", self._url)
        self._input = chunk

    def _step(self, max_length: int) -> bytes:
        data, self._input = self._input, b""
        try:
            out = self._brotli.process(data, output_buffer_limit=max_length)
        except brotli.error as error:
            raise _corrupt("br", self._url, error) from None
        self._maybe_more = bool(out) and not self._brotli.is_finished()
        return out

    def _has_more(self) -> bool:
        return bool(self._input) or self._maybe_more or not self._brotli.can_accept_more_data()

    def _check_complete(self) -> None:
        if not self._brotli.is_finished():
            raise _truncated("br", self._url)


class _ZstdStage(Decoder):
    """RFC 8878 via zipfmt's bounded zstd decoder, its InvalidCarton errors
    translated. Data after the last frame must be another frame."""

    def __init__(self, url: str) -> None:
        super().__init__("zstd")
        self._url = url
        self._zstd = make_decoder(ZSTD, "zstd")
        self._input = b""

    def _feed(self, chunk: bytes) -> None:
        self._input = chunk

    def _step(self, max_length: int) -> bytes:
        data, self._input = self._input, b""
        try:
            return self._zstd.decode(data, max_length)
        except InvalidCarton as error:
            raise _corrupt("zstd", self._url, error.problem) from None

    def _has_more(self) -> bool:
        return bool(self._input) or not self._zstd.needs_input

    def _check_complete(self) -> None:
        try:
            self._zstd.finish()
        except InvalidCarton:
            raise _truncated("zstd", self._url) from None
