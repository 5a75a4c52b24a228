"""What a load through the API may make the daemon touch: a source
directory's symlinks may not lead out of it (the CLI, adding a user's own
files, still follows them), and a name that resolves to nothing leaves no
trace in the index."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.daemonkit import DaemonProcess, call
from kit.inferkit import echo_carton

from cartonstore.store import Store


@pytest.fixture
def served(short_tmp: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(short_tmp / "root") as d:
        yield d


def cartons(d: DaemonProcess) -> list[str]:
    with Store(d.root) as store:
        return sorted(info.row.digest for info in store.list())


def test_a_source_directory_whose_symlink_leaves_it_is_refused_naming_it(served: DaemonProcess,
                                                                         short_tmp: Path) -> None:
    secret = short_tmp / "secret.txt"
    secret.write_text("the daemon's eyes only")
    source = echo_carton(short_tmp / "sneaky", dtypes=["float32"])
    os.symlink(secret, source / "model" / "notes.txt")
    before = cartons(served)
    status, body = call(served, "POST", "/v2/repository/models/sneaky/load",
                        json={"parameters": {"source": str(source)}})
    assert status == 400, body
    assert "model/notes.txt" in body["error"] and "symlink out of the carton" in body["error"]
    assert cartons(served) == before
    # The user's own CLI follows it: their files, read with their rights.
    with Store(served.root) as store:
        added = store.add(source, name="mine")
        assert (store.materialize(added.digest) / "model" / "notes.txt").read_text() == secret.read_text()


def test_a_symlink_inside_the_carton_is_still_fine(served: DaemonProcess, short_tmp: Path) -> None:
    source = echo_carton(short_tmp / "linked", dtypes=["float32"])
    os.symlink("main.py", source / "model" / "alias.py")
    status, body = call(served, "POST", "/v2/repository/models/linked/load",
                        json={"parameters": {"source": str(source)}})
    assert status == 200, body


@pytest.mark.parametrize("name", ["never-added", "abcdef0123"])
def test_a_name_that_resolves_to_nothing_leaves_no_trace(served: DaemonProcess, name: str) -> None:
    status, body = call(served, "POST", f"/v2/repository/models/{name}/load", json={})
    assert status == 404, body
    index = call(served, "POST", "/v2/repository/index", json={})[1]
    assert name not in [row["name"] for row in index]
    assert call(served, "GET", f"/v2/models/{name}/ready")[0] != 200


@pytest.mark.parametrize("name", ["a b", "x" * 300, ".hidden", "a;b"])
def test_a_bad_name_is_refused_before_anything_is_kept(served: DaemonProcess, name: str) -> None:
    status, body = call(served, "POST", f"/v2/repository/models/{name}/load", json={})
    assert status == 400 and "invalid name" in body["error"], body
    index = call(served, "POST", "/v2/repository/index", json={})[1]
    assert index == []


@pytest.mark.parametrize("metadata", ["MANIFEST", "LINKS", "carton.toml"])
def test_a_metadata_file_that_is_a_symlink_out_is_refused_and_not_echoed(served: DaemonProcess, short_tmp: Path,
                                                                        metadata: str) -> None:
    """MANIFEST and LINKS are read whole and their bad lines quoted in the
    error: a symlink out of the carton would read a secret into the answer."""
    secret = short_tmp / "token"
    secret.write_text("s3cr3t-line-one\n")
    source = echo_carton(short_tmp / f"leaky-{metadata}", dtypes=["float32"])
    (source / metadata).unlink(missing_ok=True)
    os.symlink(secret, source / metadata)
    status, body = call(served, "POST", "/v2/repository/models/leaky/load",
                        json={"parameters": {"source": str(source)}})
    assert status == 400 and metadata in body["error"], body
    assert "s3cr3t" not in json.dumps(body)
