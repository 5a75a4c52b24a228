"""What a model file holds, read from its header alone: the format its
suffix names and, for safetensors and GGUF files, the summary their
headers give (tensors, parameters, dtypes; a GGUF file's architecture,
quantization and context length). What ``inspect`` shows of the files of
a carton that no runner serves, and of such a file given by its path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO

from cartonstore.errors import InvalidCarton

from .checks import check_safetensors
from .from_files import format_of_path

HEADER_READERS = ("safetensors", "gguf")
"""The formats whose header is summarized."""


def describe_model_file(path: str, size: int, open_bytes: Callable[[], BinaryIO] | None) -> dict[str, Any]:
    """``path``'s format (None when its suffix names none) and size, with
    ``header`` its header's summary, or ``problem`` what is wrong with it
    (a file the store holds is shown even when its header is broken);
    ``open_bytes`` None: its bytes are not at hand (no header read)."""
    fmt = format_of_path(path)
    out: dict[str, Any] = {"path": path, "format": fmt, "size": size, "header": None, "problem": None}
    if fmt not in HEADER_READERS or open_bytes is None:
        return out
    try:
        out["header"] = _header_summary(fmt, path, size, open_bytes)
    except InvalidCarton as e:
        out["problem"] = str(e)
    return out


def _header_summary(fmt: str, path: str, size: int, open_bytes: Callable[[], BinaryIO]) -> dict[str, Any]:
    if fmt == "safetensors":
        return check_safetensors(path, open_bytes, size).summary()
    from cartonstore.format.gguf import parse_gguf
    from cartonstore.format.read_at import read_at_stream

    with open_bytes() as f:
        return parse_gguf(read_at_stream(f), size, file=path).summary()


def header_text(d: dict[str, Any]) -> str:
    """One line of a described file's header summary."""
    if d["problem"]:
        return f"unreadable: {d['problem']}"
    h = d["header"]
    if h is None:
        return ""
    parts = [f"{h['tensors']} tensors", f"{_count(h['parameters'])} parameters"]
    if d["format"] == "safetensors":
        return ", ".join([*parts, " ".join(f"{dtype} x{n}" for dtype, n in h["dtypes"].items())])
    model = " ".join(str(v) for v in (h["architecture"], repr(h["name"]) if h["name"] else None) if v)
    extra = [f"quantization {h['quantization']}" if h["quantization"] else None,
             f"context {h['context_length']}" if h["context_length"] is not None else None]
    return ", ".join([model or "no architecture"] + [e for e in extra if e] + parts + [f"GGUF v{h['version']}"])


def _count(n: int) -> str:
    """A parameter count as model cards say it: 6.7B, 125M, 136."""
    for scale, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)
