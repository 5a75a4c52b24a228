"""A blob read by its callers while a fetch's thread writes it (oci/arriving.py):
each caller is woken by the writer when bytes land, not by looking again.
LOOK_AGAIN_SECONDS is raised to an hour here, so a caller that only looked
again would not get its bytes within the test's bound. Real BlobWriter,
real files, a real writing thread."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pytest

from cartonstore.oci import arriving as arriving_module
from cartonstore.oci.arriving import Arriving
from cartonstore.store.content.blobs import BlobWriter
from cartonstore.store.root.layout import StoreLayout

PIECES = [bytes([i]) * 1000 for i in range(1, 6)]


def test_callers_are_woken_by_each_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arriving_module, "LOOK_AGAIN_SECONDS", 3600.0)
    layout = StoreLayout(tmp_path)
    layout.tmp_dir.mkdir(parents=True)
    blob = b"".join(PIECES)
    digest = hashlib.sha256(blob).hexdigest()

    async def scenario() -> list[bytes]:
        arriving = Arriving(digest, len(blob), tmp_path / "stored")
        with BlobWriter(layout, label="arriving") as writer:
            arriving.watch(writer)
            return await follow(arriving, writer)

    async def follow(arriving: Arriving, writer: BlobWriter) -> list[bytes]:
        got: list[bytes] = []
        step = threading.Event()

        async def read() -> None:
            async for piece in arriving.chunks():
                got.append(piece)
                step.set()

        def write() -> None:   # the fetch's thread: a piece, then wait until a caller had it
            for piece in PIECES:
                writer.write(piece)
                assert step.wait(10), "a caller was not woken by the write"
                step.clear()

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.05)   # the caller waits for the first bytes
        writing = asyncio.ensure_future(asyncio.to_thread(write))
        done, _ = await asyncio.wait([writing], timeout=30)
        assert writing in done
        await writing
        arriving.verified.set_result(len(blob))
        await asyncio.wait_for(reader, 10)
        arriving.end(None)
        return got

    got = asyncio.run(scenario())
    assert b"".join(got) == blob and len(got) >= len(PIECES)
