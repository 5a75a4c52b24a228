"""The small files of a remote carton (carton.toml, tensor_data tomls:
what check_carton reads whole) checked against MANIFEST as soon as they
are prefetched, and one that does not match, or arrived corrupt (CRC-32,
undecodable), fetched from the blob's other sources (its LINKS URLs, the
mirrors) instead.

Why before check_carton: it validates those very bytes. A carton.toml that
came wrong over the wire must not be the one the carton is checked (and
then stored) by, nor fail an add that another source could complete.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from cartonstore.errors import CartonStoreError, InvalidCarton
from cartonstore.fetch.sources.remote_zip import RemoteCartonView, read_whole_limit
from cartonstore.format.links import parse_links
from cartonstore.format.manifest import parse_manifest
from cartonstore.sources.zip_source import METADATA_NAMES  # MANIFEST is what is checked against; LINKS is not in it

from .blob_fetcher import BlobFetcher


def mismatched_small_files(view: RemoteCartonView) -> dict[str, tuple[str, str]]:
    """path -> (the MANIFEST hash, what is wrong with its prefetched bytes),
    for each prefetched file MANIFEST lists with another hash, or that
    arrived corrupt (pure). InvalidCarton for a corrupt one MANIFEST does
    not list: nothing says what its bytes should be."""
    raw = view.read_metadata("MANIFEST")
    try:
        listed = parse_manifest(raw).as_dict() if raw is not None else {}
    except CartonStoreError:
        listed = {}   # check_carton says what is wrong with it
    out = {}
    for path, problem in view.broken.items():
        if path not in listed:
            raise InvalidCarton(path, problem)
        out[path] = (listed[path], problem)
    for path, expected in listed.items():
        data = view.prefetched(path)
        if data is None or path in METADATA_NAMES or view.rz.entries[path].is_symlink:
            continue   # a symlink's prefetched bytes are its target; MANIFEST lists the hash of what it points to
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            out[path] = (expected, f"bytes hash to sha256 {got}")
    return out


async def mend_small_files(view: RemoteCartonView, fetcher: BlobFetcher) -> int:
    """Replace each prefetched file that does not match MANIFEST with its
    bytes from the blob's other sources; returns how many were. Raises
    ManifestMismatch naming every source tried when none has them."""
    wrong = await asyncio.to_thread(mismatched_small_files, view)
    if not wrong:
        return 0
    links = await asyncio.to_thread(_links_of, view)
    for path, (expected, problem) in wrong.items():
        # No more than the file may hold (what prefetch_view allows it): a source must not make this
        # read gigabytes into memory for a carton.toml.
        staged = await fetcher.stage_instead(path, expected, view.rz.url, problem,
                                             links.get(expected, ()), max_size=read_whole_limit(path))
        try:
            view.replace(path, await asyncio.to_thread(Path(staged.tmp_path).read_bytes), expected)
        finally:
            staged.discard()   # small: staged again from the view's bytes with the rest
    return len(wrong)


def _links_of(view: RemoteCartonView) -> dict:
    """The carton's LINKS (up to 64 MiB of TOML: parsed in a thread), {} if it has none or they do not parse."""
    try:
        return parse_links(view.read_metadata("LINKS") or b"")
    except CartonStoreError:
        return {}
