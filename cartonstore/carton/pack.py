"""``cartonstore pack``: an unpacked carton directory -> a .carton file."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from cartonstore.errors import InvalidInput
from cartonstore.sources.dir_source import DirCartonView

from .checks import check_carton, check_safetensors, check_top_level, compute_manifest, is_safetensors
from .writer import WrittenCarton, plan_links, write_carton


def pack_directory(src: Path, out: Path, *, compression: str = "zstd", link_prefix: str | None = None,
                   link_min_size: int = 0) -> WrittenCarton:
    """Compute MANIFEST, validate the carton as ingest would, and write it.
    A MANIFEST or LINKS already in the directory is ignored (recomputed), and
    so is the output itself (a previous run's, wherever -o points) with the
    temporary files of an interrupted pack beside it. Any other top-level
    entry outside the format is refused (InvalidCarton, naming them)."""
    if link_min_size and not link_prefix:
        raise InvalidInput("--link-min-size needs --link-prefix")
    view = DirCartonView(src)
    drop_own_output(view, out)
    check_top_level(view, {})  # before any file is read
    checked = check_carton(view, manifest_raw=compute_manifest(view), links_raw=b"")
    for e in checked.entries:
        f = view.files[e.path]
        if f.kind == "file" and is_safetensors(e.path):
            check_safetensors(e.path, functools.partial(view.open, e.path), f.size or 0)
    links = plan_links(checked, url_prefix=link_prefix, min_size=link_min_size) if link_prefix else None
    return write_carton(out, checked, view, compression=compression, links=links)


def drop_own_output(view: DirCartonView, out: Path) -> list[str]:
    """Forget the files of ``view`` that are the output: the file -o names
    (written where -o's last component lands, its parent's symlinks
    resolved), the file an -o symlink points to, and write_carton's
    ``.<name>.<hex>.tmp`` leftovers beside it. Returns the paths dropped."""
    landing = Path(os.path.realpath(out.parent)) / out.name
    targets = {str(landing), os.path.realpath(out)}
    leftover = re.compile(rf"\.{re.escape(out.name)}\.[0-9a-f]{{8}}\.tmp")
    dropped = []
    for rel in list(view.files):
        full = view.root / rel
        if (str(full) in targets or os.path.realpath(full) in targets
                or (full.parent == landing.parent and leftover.fullmatch(full.name))):
            del view.files[rel]
            dropped.append(rel)
    return dropped
