"""The Content-Type of a carton's misc/ file: from its extension, else from
its first bytes (Carton itself writes example files without an extension,
such as misc/_example_misc_file_0, a PNG). Pure: the caller reads the head.
"""

from __future__ import annotations

import mimetypes

SNIFF_BYTES = 16
FALLBACK = "application/octet-stream"

# Extensions whose type must not depend on the host's /etc/mime.types.
_BY_EXTENSION = {
    ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
    ".webp": "image/webp", ".svg": "image/svg+xml", ".mp3": "audio/mpeg", ".wav": "audio/wav",
    ".flac": "audio/flac", ".ogg": "audio/ogg", ".mp4": "video/mp4", ".webm": "video/webm",
    ".txt": "text/plain; charset=utf-8", ".md": "text/markdown; charset=utf-8", ".json": "application/json",
}


def _sniffed(head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "audio/mpeg"     # an ID3 tag, or an MPEG audio frame sync
    if head[4:8] == b"ftyp":
        return "video/mp4"
    if head.startswith(b"fLaC"):
        return "audio/flac"
    if head.startswith(b"OggS"):
        return "audio/ogg"
    return None


def media_type(name: str, head: bytes) -> str:
    """The type of file ``name`` whose first bytes are ``head``."""
    dot = name.rfind(".")
    extension = name[dot:].lower() if dot > name.rfind("/") else ""
    if extension in _BY_EXTENSION:
        return _BY_EXTENSION[extension]
    guessed = mimetypes.guess_type(name, strict=False)[0] if extension else None
    return guessed or _sniffed(head) or FALLBACK
