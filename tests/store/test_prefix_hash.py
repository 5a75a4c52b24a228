"""Hashing a blob written as out-of-order parts, and reserving its space.

Real threads write real files; the hasher must produce the sha256 of the
bytes in file order however the parts interleave, and never wait forever.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import threading
from pathlib import Path

import pytest

from cartonstore.errors import Unavailable
from cartonstore.store.content.blobs import BlobWriter
from cartonstore.store.content.prefix_hash import HashingStopped, PrefixHasher
from cartonstore.store.root.layout import StoreLayout


def _writer(root: Path) -> BlobWriter:
    layout = StoreLayout(root)
    layout.tmp_dir.mkdir(parents=True, exist_ok=True)
    return BlobWriter(layout, label="parts")


def _write_parts(writer: BlobWriter, data: bytes, parts: int, rng: random.Random) -> None:
    """Each part in its own thread, in chunks of random sizes, the threads
    started in random order."""
    step = -(-len(data) // parts)

    def part(start: int) -> None:
        pos, end = start, min(len(data), start + step)
        while pos < end:
            n = min(end - pos, rng.randint(1, 200_000))
            writer.write_at(pos, memoryview(data)[pos:pos + n])
            pos += n

    starts = list(range(0, len(data), step))
    rng.shuffle(starts)
    threads = [threading.Thread(target=part, args=(s,)) for s in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("parts", [1, 2, 7])
def test_parts_written_in_any_order_hash_as_the_file(tmp_path: Path, parts: int) -> None:
    data = os.urandom(3_000_001)
    with _writer(tmp_path) as w:
        hasher = w.hash_parts(len(data))
        hashing = threading.Thread(target=hasher.run)
        hashing.start()
        _write_parts(w, data, parts, random.Random(parts))
        hashing.join(timeout=30)
        assert not hashing.is_alive()
        w.parts_hashed()
        assert w.size == len(data)
        staged = w.stage(expected_digest=hashlib.sha256(data).hexdigest(), expected_size=len(data))
    assert staged.tmp_path.read_bytes() == data
    staged.discard()


def test_the_hasher_follows_the_prefix_not_the_parts(tmp_path: Path) -> None:
    """Bytes after a gap are not hashed until the gap is filled."""
    with _writer(tmp_path) as w:
        hasher = w.hash_parts(300)
        w.write_at(100, b"b" * 100)
        w.write_at(200, b"c" * 100)
        assert hasher.prefix() == 0
        w.write_at(0, b"a" * 50)
        assert hasher.prefix() == 50
        w.write_at(50, b"a" * 50)
        assert hasher.prefix() == 300  # the three runs merged
        hasher.run()
        w.parts_hashed()
        assert w.digest == hashlib.sha256(b"a" * 100 + b"b" * 100 + b"c" * 100).hexdigest()


def test_stop_ends_a_hasher_waiting_on_a_gap(tmp_path: Path) -> None:
    with _writer(tmp_path) as w:
        hasher = w.hash_parts(1000)
        w.write_at(0, b"x" * 10)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                hasher.run()
            except BaseException as e:  # noqa: BLE001 - looked at below
                failure.append(e)

        t = threading.Thread(target=run)
        t.start()
        t.join(timeout=0.3)
        assert t.is_alive() and hasher.hashed == 10  # waits for the rest
        hasher.stop()
        t.join(timeout=10)
        assert not t.is_alive() and isinstance(failure[0], HashingStopped)


def test_a_file_cut_short_under_the_hasher_is_an_error(tmp_path: Path) -> None:
    """Bytes said to have landed but missing from the file: a clear error, not a wrong digest."""
    with _writer(tmp_path) as w:
        fd = os.open(w.tmp_path, os.O_RDONLY)
        try:
            hasher = PrefixHasher(fd, 100, name="cut")
            hasher.landed(0, 100)  # nothing was written
            with pytest.raises(Unavailable, match="short read hashing cut"):
                hasher.run()
        finally:
            os.close(fd)


def test_reserving_space_does_not_change_the_file(tmp_path: Path) -> None:
    with _writer(tmp_path) as w:
        w.write(b"abc")
        w.reserve(64 << 20)
        assert os.stat(w.tmp_path).st_size == 3
        w.write(b"def")
        staged = w.stage(expected_digest=hashlib.sha256(b"abcdef").hexdigest())
    assert staged.tmp_path.read_bytes() == b"abcdef"
    staged.discard()


def test_reserving_more_than_the_disk_holds_fails_at_once(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        with _writer(mnt) as w:
            with pytest.raises(Unavailable, match="no space left on device"):
                w.reserve(64 << 20)
            path = w.tmp_path
        assert not path.exists()  # the writer cleaned up
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_bytes_landing_twice_are_refused(tmp_path: Path) -> None:
    """A retried part must resume after what it wrote: rewriting bytes the
    hasher may have read would leave a digest that is not of the file."""
    with _writer(tmp_path) as w:
        hasher = w.hash_parts(300)
        w.write_at(0, b"a" * 100)
        w.write_at(200, b"c" * 50)
        for offset, length in [(50, 10), (90, 20), (190, 20), (240, 20), (0, 300)]:
            with pytest.raises(ValueError, match="overlap"):
                hasher.landed(offset, length)
        w.write_at(100, b"b" * 100)   # exactly the gap: fine
        w.write_at(250, b"c" * 50)
        assert hasher.prefix() == 300
