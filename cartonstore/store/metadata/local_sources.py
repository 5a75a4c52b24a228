"""Local sources: where on this host a blob was read from when it was added.

A blob taken from a local .carton file is recorded with the file's path,
size and mtime and its entry's place in the zip (name, local header offset,
compressed size, method); one taken from an unpacked carton directory with
the file's own path, size and mtime. These rows sit next to LINKS URLs
(``links``) and the carton's own URL (``cartons.source``) as the ways an
evicted blob can come back (fetch/sources/local_files.py reads them again, verified
by hash like any fetch).

gc asks ``Index.unsourced_blobs``: a local source counts only while its file still
has the size and mtime recorded (one stat per file, at snapshot time); a
file moved away or modified after the add gives its blobs no source. A file
changed in place with the same size and mtime passes that check and is
caught by the hash when it is read again.

Stores written before this table existed simply have no rows: their blobs
count as sourced only through LINKS or a carton URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .source_rows import LocalSource

if TYPE_CHECKING:
    from cartonstore.carton.checks import CheckedCarton
    from cartonstore.sources.view import CartonView


def local_sources_of(view: CartonView, checked: CheckedCarton, *, skip_under: Path) -> list[LocalSource]:
    """The local sources a carton view offers for its blobs; none for a view
    under ``skip_under`` (the store's root: uploads and whole downloads in
    tmp/ are deleted once added, and a model directory under models/ is the
    store's own hardlinks, gone with the blobs gc evicts)."""
    from cartonstore.sources import DirCartonView, ZipCartonView

    out: list[LocalSource] = []
    if isinstance(view, ZipCartonView):
        zip_path = view.zip_path.resolve()
        if _is_under(zip_path, skip_under):
            return out
        st = os.stat(zip_path)
        for digest, path in checked.files_by_digest().items():
            e = view.entry(path)
            out.append(LocalSource(digest, str(zip_path), e.name, st.st_size, st.st_mtime_ns,
                                   e.local_header_offset, e.compressed_size, e.method))
    elif isinstance(view, DirCartonView):
        if _is_under(view.root, skip_under):
            return out
        for digest, path in checked.files_by_digest().items():
            full = view.root / path
            try:
                st = os.stat(full)
            except OSError:
                continue
            out.append(LocalSource(digest, str(full), "", st.st_size, st.st_mtime_ns))
    return out


def _is_under(path: Path, top: Path) -> bool:
    top = top.resolve()
    return path == top or top in path.parents


def stale_reason(src: LocalSource) -> str | None:
    """Why this source cannot serve its blob now (None: it looks unchanged)."""
    try:
        st = os.stat(src.path)
    except FileNotFoundError:
        return f"{src.describe()}: the file is gone (moved away or deleted since it was added)"
    except OSError as e:
        return f"{src.describe()}: cannot read it: {e.strerror}"
    if st.st_size != src.file_size or st.st_mtime_ns != src.mtime_ns:
        return (f"{src.describe()}: the file changed since it was added (size {src.file_size} -> "
                f"{st.st_size}, mtime differs: {st.st_mtime_ns != src.mtime_ns})")
    return None
