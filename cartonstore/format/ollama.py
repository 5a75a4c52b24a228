"""Ollama's layers as files (pure): the one table by which an OCI pull of
an Ollama model (oci/model_formats.py) and an adopt of an Ollama models
directory (sources/adoptable.py) both name them, so one model is one
carton whichever way it came. The manifest's config blob (a container
image config: format, family, rootfs) is no file of the model, on either
side."""

from __future__ import annotations

from collections.abc import Sequence

from cartonstore.errors import InvalidInput

OLLAMA_PREFIX = "application/vnd.ollama.image."
OLLAMA_NAMES = {
    "model": "model.gguf",
    "projector": "projector.gguf",
    "adapter": "adapter.gguf",
    "template": "template",
    "system": "system.txt",
    "params": "params.json",
    "messages": "messages.json",
    "license": "LICENSE",
}
"""The file each Ollama layer becomes: what ``ollama show --modelfile``
calls it (FROM: the GGUF, TEMPLATE, SYSTEM, PARAMETER, MESSAGE, LICENSE,
ADAPTER), a second layer of a kind numbered (``LICENSE-2``)."""


def ollama_file_names(media_types: Sequence[object], where: str) -> list[str]:
    """The file each layer becomes, in the manifest's order (OLLAMA_NAMES);
    a media type not in the table is refused, naming its layer."""
    kinds = []
    for number, media_type in enumerate(media_types):
        kind = media_type[len(OLLAMA_PREFIX):] if isinstance(media_type, str) else None
        if not isinstance(media_type, str) or not media_type.startswith(OLLAMA_PREFIX) or kind not in OLLAMA_NAMES:
            raise InvalidInput(f"{where}: layer {number}: media type {media_type!r} is not an Ollama layer read "
                               f"here ({', '.join(OLLAMA_PREFIX + k for k in OLLAMA_NAMES)})", subject=where)
        kinds.append(kind)
    return [numbered_name(OLLAMA_NAMES[kind], kinds[:i].count(kind)) for i, kind in enumerate(kinds)]


def numbered_name(name: str, i: int) -> str:
    """The ``i``th file of one kind: ``NAME``, then ``NAME-2``, ``NAME-3``..."""
    stem, dot, suffix = name.partition(".")
    return name if i == 0 else f"{stem}-{i + 1}{dot}{suffix}"
