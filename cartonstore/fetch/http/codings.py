"""Which HTTP Content-Encodings the fetcher decodes, and so offers.

Apart from the decoders (fetch/http/content_encoding.py) because the settings need these names
at start and must not load the codecs' modules with them.
"""

from __future__ import annotations

PIECE_SIZE = 1 << 20
"""The most a decoding stage produces per step (encoding.ContentDecoder)."""


def _brotli_is_bounded() -> bool:
    # output_buffer_limit arrived in brotli 1.2; without it one small chunk
    # of a brotli bomb decodes to gigabytes in a single call, so older
    # versions do not get "br" offered or accepted at all.
    import brotli

    try:
        brotli.Decompressor().process(b"", output_buffer_limit=PIECE_SIZE)
    except TypeError:
        return False
    return True


SUPPORTED_CODINGS: tuple[str, ...] = tuple(
    coding for coding in ("zstd", "br", "gzip", "deflate")
    if coding != "br" or _brotli_is_bounded()
)

DEFAULT_ACCEPT_ENCODING = ", ".join(SUPPORTED_CODINGS)
"""The Accept-Encoding to send: "zstd, br, gzip, deflate"."""
