"""Hugging Face model repositories as a source: ``hf://ORG/NAME[@REVISION]``.

reference.py reads references and the --include/--exclude globs, and
listing.py the Hub's listing of a revision (both pure); hub.py speaks the
Hub's API and names its refusals; pull.py adds a commit's files to the
store as a carton of model files (cartonstore.carton.from_files).

Entry point: ``HF_REFERENCE``, the source kind a
``cartonstore.fetch.puller.Puller`` reads ``hf://`` references by
(``cartonstore.config.pulling`` hands it to the pullers it builds; fetch
never imports hf). The endpoint and token are fetch.hub's ([hf],
HF_ENDPOINT, HF_TOKEN). Only reference.py is loaded here; the rest on
first use.
"""

from __future__ import annotations

from typing import Any

from cartonstore.fetch.http.source_kinds import SourceKind

from .reference import SCHEME, parse_reference, with_patterns


async def _add(puller: Any, ref: str, name: str | None, force: bool, lazy: bool) -> Any:
    from .pull import add_from_hub

    return await add_from_hub(puller, parse_reference(ref), name, force, lazy=lazy)


HF_REFERENCE = SourceKind("hf", (SCHEME.removesuffix("://"),), lambda _puller, text: str(parse_reference(text)), _add)
"""A Hugging Face model repository at a revision, ``hf://ORG/NAME@REV`` (reference.py)."""

__all__ = ["HF_REFERENCE", "parse_reference", "with_patterns"]
