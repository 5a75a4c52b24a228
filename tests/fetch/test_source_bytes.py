"""The store's figures by kind of source: the bytes each kind fetched into
the store and the bytes an add found already stored, counted in the index
by the commit that adds the blobs, against a real origin; read back by
another process (`cartonstore ls --sources`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, carton_entries, manifest_for, sha, write_zip
from kit.fetchkit import fast_config, pull
from kit.origin import Fault, Origin

from cartonstore.errors import CartonStoreError
from cartonstore.format.links import build_links
from cartonstore.store import Store

SHARED = os.urandom(300_000)


def toml(model: str) -> bytes:
    return MINIMAL_TOML.replace(b'"tiny"', f'"{model}"'.encode())


def carton_bytes(files: dict[str, bytes]) -> int:
    """What a carton's blobs hold: each distinct file once, and its MANIFEST."""
    return sum(len(d) for d in {sha(d): d for d in files.values()}.values()) + len(manifest_for(files))


def figures(store: Store) -> dict[str, dict[str, int]]:
    return {f.kind: f.as_json() for f in store.source_bytes()}


def ls_sources(root: Path) -> dict[str, dict[str, int]]:
    """`cartonstore ls --sources --json`, run as its own process."""
    out = subprocess.run([sys.executable, "-m", "cartonstore.cli", "ls", "--sources", "--json", "--root", str(root)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def serve(origin: Origin, tmp_path: Path, name: str, files: dict[str, bytes], *, links: dict[str, str] | None = None,
          fault: Fault | None = None) -> str:
    """A carton at origin's /NAME.carton; the files named in ``links``
    (path -> URL) only in its LINKS."""
    linked = links or {}
    entries = carton_entries(files, omit=tuple(linked),
                             links=build_links({sha(files[p]): [u] for p, u in linked.items()}) if linked else None)
    return origin.put_file(f"/{name}.carton", write_zip(tmp_path / f"{name}.carton", entries), fault=fault)


def test_url_adds_count_what_they_fetched_and_what_the_store_had(tmp_path: Path, origin: Origin, store: Store) -> None:
    """Two cartons sharing a blob: the second's reused bytes are the shared
    blob's; its LINKS file, missing at its URL, comes from a mirror and
    counts as the mirror's. Another process reads the same figures."""
    own_b = os.urandom(50_000)
    a = {"carton.toml": toml("a"), "model/shared.bin": SHARED, "model/a.bin": os.urandom(100_000)}
    b = {"carton.toml": toml("b"), "model/shared.bin": SHARED, "model/b.bin": own_b}
    origin.put(f"/mirror/{sha(own_b)}", own_b)
    config = fast_config(mirrors=(origin.url("/mirror"),))
    url_a = serve(origin, tmp_path, "a", a)
    url_b = serve(origin, tmp_path, "b", b, links={"model/b.bin": origin.url(f"/gone/{sha(own_b)}")})

    pull(store, url_a, config)
    assert figures(store)["url"] == {"fetched_bytes": carton_bytes(a), "fetched_blobs": 4,
                                     "reused_bytes": 0, "reused_blobs": 0}
    result = pull(store, url_b, config)
    assert result.complete
    seen = figures(store)
    assert seen["url"] == {"fetched_bytes": carton_bytes(a) + len(b["carton.toml"]) + len(manifest_for(b)),
                           "fetched_blobs": 6, "reused_bytes": len(SHARED), "reused_blobs": 1}
    assert seen["mirror"] == {"fetched_bytes": len(own_b), "fetched_blobs": 1, "reused_bytes": 0, "reused_blobs": 0}
    assert all(not any(v.values()) for k, v in seen.items() if k not in ("url", "mirror"))
    assert ls_sources(store.root) == seen


def test_a_whole_download_counts_every_byte_as_fetched(tmp_path: Path, origin: Origin, store: Store) -> None:
    """A server that ignores Range sends the whole carton, the blob the
    store had too: nothing was saved by having it."""
    a = {"carton.toml": toml("a"), "model/shared.bin": SHARED}
    c = {"carton.toml": toml("c"), "model/shared.bin": SHARED, "model/c.bin": b"c" * 1000}
    pull(store, serve(origin, tmp_path, "a", a), fast_config())
    pull(store, serve(origin, tmp_path, "c", c, fault=Fault(ignore_range=True)), fast_config())
    assert figures(store)["url"] == {"fetched_bytes": carton_bytes(a) + carton_bytes(c), "fetched_blobs": 3 + 4,
                                     "reused_bytes": 0, "reused_blobs": 0}


def test_a_failed_add_counts_nothing(tmp_path: Path, origin: Origin, store: Store) -> None:
    a = {"carton.toml": toml("a"), "model/shared.bin": SHARED}
    pull(store, serve(origin, tmp_path, "a", a), fast_config())
    before = figures(store)
    lying = carton_entries({"carton.toml": toml("x"), "model/w.bin": b"w" * 5000},
                           manifest=manifest_for({"carton.toml": toml("x"), "model/w.bin": b"v" * 5000}))
    url = origin.put_file("/x.carton", write_zip(tmp_path / "x.carton", lying))
    with pytest.raises(CartonStoreError, match="model/w.bin"):
        pull(store, url, fast_config())
    assert figures(store) == before
