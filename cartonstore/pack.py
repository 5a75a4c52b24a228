"""``cartonstore pack``: an unpacked carton directory -> a .carton file."""

from __future__ import annotations

from pathlib import Path

from .carton_writer import WrittenCarton, plan_links, write_carton
from .checks import check_carton, check_safetensors, compute_manifest, is_safetensors
from .errors import InvalidInput
from .sources.dir_source import DirCartonView


def pack_directory(src: Path, out: Path, *, compression: str = "zstd", link_prefix: str | None = None,
                   link_min_size: int = 0) -> WrittenCarton:
    """Compute MANIFEST, validate the carton as ingest would, and write it.
    A MANIFEST or LINKS already in the directory is ignored (recomputed)."""
    if link_min_size and not link_prefix:
        raise InvalidInput("--link-min-size needs --link-prefix")
    view = DirCartonView(src)
    checked = check_carton(view, manifest_raw=compute_manifest(view), links_raw=b"")
    for e in checked.entries:
        f = view.files[e.path]
        if f.kind == "file" and is_safetensors(e.path):
            check_safetensors(e.path, lambda p=e.path: view.open(p), f.size or 0)
    links = plan_links(checked, url_prefix=link_prefix, min_size=link_min_size) if link_prefix else None
    return write_carton(out, checked, view, compression=compression, links=links)
