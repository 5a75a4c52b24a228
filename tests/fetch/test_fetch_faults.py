"""Fetching LINKS blobs from a real misbehaving HTTP server.

Transient faults are survived (retries, resume); persistent ones give an
error that names the URL and what went wrong. Either way nothing partial or
wrong reaches blobs/, tmp/ is left empty, and the next attempt works once
the server behaves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kit.daemonkit import wait_for_async
from kit.fetchkit import URLS_ONLY, blob_files, fast_config, linked_carton, materialize, pull, tmp_files
from kit.origin import Fault

from cartonstore.errors import CartonStoreError, FetchError
from cartonstore.fetch.http.policy import UrlPolicy
from cartonstore.store import Store

PAYLOAD = os.urandom(700_000)


@pytest.fixture(autouse=True, params=["aiohttp", "socket"])
def body_path(request, monkeypatch) -> str:
    """Every test twice: bodies received through aiohttp, and read from
    their socket by the stream's thread (socket_body.py; there only for
    bodies of DIRECT_MIN or more, so here for every body with a length)."""
    if request.param == "socket":
        monkeypatch.setattr("cartonstore.fetch.http.socket_body.DIRECT_MIN", 1)
    return request.param


@pytest.fixture
def served(tmp_path: Path, origin) -> tuple[Path, str]:
    carton, shas = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD})
    return carton, shas["model/w.bin"]


TRANSIENT = {
    "500s then success": Fault(status_sequence=[500, 503]),
    "429 with Retry-After": Fault(status_sequence=[429], retry_after="0"),
    "truncated body, correct Content-Length": Fault(truncate_at=300_000, times=1),
    "connection reset mid-body": Fault(reset_at=250_000, times=1),
    "stall mid-body": Fault(stall_at=100_000, stall_seconds=5, times=1),
    "body longer than announced": Fault(extra_bytes=b"trailing junk" * 100),
    "zstd encoded": Fault(encoding="zstd"),
    "gzip encoded": Fault(encoding="gzip"),
    "brotli encoded": Fault(encoding="br"),
    "deflate (zlib) encoded": Fault(encoding="deflate"),
    "deflate (raw) encoded": Fault(encoding="deflate-raw"),
    "double Content-Encoding": Fault(double_encoding=("gzip", "zstd")),
    "encoded and truncated once": Fault(encoding="gzip", truncate_at=1000, times=1),
}


@pytest.mark.parametrize("case", sorted(TRANSIENT))
def test_transient_faults_are_survived(case: str, store: Store, origin, served) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", TRANSIENT[case])
    r = pull(store, str(carton))
    assert r.complete
    assert store.blobs.path(digest).read_bytes() == PAYLOAD
    assert tmp_files(store) == []


def test_reset_resumes_from_the_bytes_already_hashed(store: Store, origin, served) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(reset_at=250_000, times=1))
    pull(store, str(carton))
    gets = [r for r in origin.requests if r.path == f"/blobs/{digest}"]
    assert len(gets) == 2
    assert gets[0].range is None
    # The second request starts where the hashed bytes end (aiohttp may drop
    # a little of what was buffered when the reset hit), never at 0.
    resumed_at = int(gets[1].range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 250_000
    assert origin.bytes_sent_for(f"/blobs/{digest}") == len(PAYLOAD) + 250_000 - resumed_at


def test_ignored_range_on_resume_starts_over(store: Store, origin, served) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(reset_at=250_000, times=1, ignore_range=True))
    pull(store, str(carton))
    assert store.blobs.path(digest).read_bytes() == PAYLOAD


PERSISTENT = {
    "wrong bytes": (Fault(wrong_bytes=True), "hash"),
    "always truncated": (Fault(truncate_at=1000), "ended early|Content-Length|body"),
    "always 500": (Fault(status_sequence=[500] * 10), "HTTP 500"),
    "404": (Fault(status_sequence=[404]), "HTTP 404"),
    "stall forever": (Fault(stall_at=10, stall_seconds=None), "timed out"),
    "gzip bomb": (Fault(gzip_bomb=4 << 30), "bomb|ratio"),
    "unknown encoding": (Fault(claimed_encoding="compress"), "compress"),
    "bogus encoding": (Fault(claimed_encoding="bogus"), "bogus"),
    "redirect loop": (Fault(redirect_loop=True), "redirect"),
    "wrong Content-Range on resume": (Fault(reset_at=1000, wrong_content_range=True), "Content-Range"),
}


@pytest.mark.parametrize("case", sorted(PERSISTENT))
def test_persistent_faults_fail_cleanly_then_recover(case: str, store: Store, origin, served) -> None:
    carton, digest = served
    fault, pattern = PERSISTENT[case]
    origin.set_fault(f"/blobs/{digest}", fault)
    with pytest.raises(FetchError, match=pattern) as info:
        pull(store, str(carton))
    assert f"/blobs/{digest}" in str(info.value)
    assert digest not in blob_files(store)
    assert tmp_files(store) == []
    assert not store.verify().corrupt_blobs
    origin.set_fault(f"/blobs/{digest}", None)
    assert pull(store, str(carton)).complete
    assert store.blobs.path(digest).read_bytes() == PAYLOAD


def test_every_url_is_tried_and_each_failure_listed(store: Store, tmp_path: Path, origin) -> None:
    from conftest import sha

    digest = sha(PAYLOAD)
    urls = [origin.url("/a/missing"), origin.url("/b/wrong"), "ftp://example.com/x", "file:///etc/passwd"]
    origin.put("/b/wrong", b"x" * len(PAYLOAD))
    carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD}, urls={"model/w.bin": urls})
    origin.remove(f"/blobs/{digest}")
    with pytest.raises(FetchError) as info:
        pull(store, str(carton))
    msg = str(info.value)
    assert "/a/missing: HTTP 404" in msg
    assert "/b/wrong" in msg and "hash" in msg
    assert "'ftp' is not allowed" in msg and "'file' is not allowed" in msg
    assert digest not in blob_files(store)


def test_second_url_serves_when_the_first_lies(store: Store, tmp_path: Path, origin) -> None:
    from conftest import sha

    origin.put("/bad", os.urandom(len(PAYLOAD)))
    origin.put("/good", PAYLOAD)
    carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD},
                              urls={"model/w.bin": [origin.url("/bad"), origin.url("/good")]})
    assert pull(store, str(carton)).complete
    assert store.blobs.has(sha(PAYLOAD))


def test_mirror_is_tried_after_links(store: Store, tmp_path: Path, origin) -> None:
    from conftest import sha

    digest = sha(PAYLOAD)
    carton, _ = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD},
                              urls={"model/w.bin": [origin.url("/gone")]})
    origin.put(f"/mirror/{digest}", PAYLOAD)
    assert pull(store, str(carton), fast_config(mirrors=(origin.url("/mirror"),))).complete
    assert origin.count(f"/mirror/{digest}") == 1


def test_redirects_are_followed_and_rechecked(store: Store, tmp_path: Path, origin) -> None:
    carton, digest = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD},
                                   urls={"model/w.bin": [origin.url("/hop")]})
    digest = digest["model/w.bin"]
    origin.put("/hop", b"", fault=Fault(redirect_to=f"/blobs/{digest}"))
    assert pull(store, str(carton)).complete
    store.remove(store.resolve("tiny"))
    # the same redirect, to a host the policy denies
    origin.put("/hop", b"", fault=Fault(redirect_to=f"http://localhost:{origin.port}/blobs/{digest}"))
    denied = fast_config(policy=UrlPolicy(deny_hosts=("localhost",), allow_private_links=True))
    with pytest.raises(CartonStoreError, match="localhost"):
        pull(store, str(carton), denied)
    assert digest not in blob_files(store)


def test_lazy_add_then_path_fetches(store: Store, origin, served) -> None:
    carton, digest = served
    r = pull(store, str(carton), lazy=True)
    assert not r.complete and origin.count(f"/blobs/{digest}") == 0
    model = materialize(store, r.digest)
    assert (model / "model" / "w.bin").read_bytes() == PAYLOAD
    assert origin.count(f"/blobs/{digest}") == 1


def test_an_evicted_blob_is_fetched_again_from_the_url_map(store: Store, origin, served) -> None:
    carton, digest = served
    d = pull(store, str(carton)).digest
    os.unlink(store.blobs.path(digest))
    store.index.forget_blob(digest)
    os.unlink(carton)  # the carton itself is gone too: the index remembers the URLs
    model = materialize(store, d)
    assert (model / "model" / "w.bin").read_bytes() == PAYLOAD


PARTS = {"parallel_threshold": 100_000, "parallel_parts": 4}


@pytest.mark.parametrize("fault,requests", [
    (None, 4),
    (Fault(reset_at=50_000, times=1), 5),           # part 0 resumes with a Range
    (Fault(stall_at=10_000, stall_seconds=5, times=1), 5),  # a stalled part is asked again
])
def test_large_blobs_come_in_parallel_parts(store: Store, origin, served, fault, requests: int) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", fault)
    assert pull(store, str(carton), fast_config(**PARTS)).complete
    assert store.blobs.path(digest).read_bytes() == PAYLOAD
    gets = [r for r in origin.requests if r.path == f"/blobs/{digest}"]
    assert len(gets) == requests
    assert {r.range for r in gets if r.range} >= {"bytes=175000-349999", "bytes=350000-524999", "bytes=525000-699999"}


def test_parts_fall_back_to_one_stream_when_ranges_are_ignored(store: Store, origin, served) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(ignore_range=True))
    assert pull(store, str(carton), fast_config(**PARTS)).complete
    assert store.blobs.path(digest).read_bytes() == PAYLOAD


def test_parts_that_keep_failing_fail_cleanly(store: Store, origin, served) -> None:
    """Every response breaks off: the add fails naming the URL, with the
    hasher that was following the parts stopped, and nothing left behind."""
    import threading

    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(reset_at=30_000))
    with pytest.raises(FetchError, match=f"/blobs/{digest}"):
        pull(store, str(carton), fast_config(**PARTS))
    assert digest not in blob_files(store) and tmp_files(store) == []
    assert [t.name for t in threading.enumerate() if t.name.startswith("cartonstore-")] == []
    origin.set_fault(f"/blobs/{digest}", None)
    assert pull(store, str(carton), fast_config(**PARTS)).complete
    assert store.blobs.path(digest).read_bytes() == PAYLOAD


def test_parts_with_wrong_bytes_are_rejected(store: Store, origin, served) -> None:
    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(wrong_bytes=True))
    with pytest.raises(FetchError, match="hash"):
        pull(store, str(carton), fast_config(**PARTS))
    assert digest not in blob_files(store) and tmp_files(store) == []


def test_verify_repair_refetches_a_corrupt_blob(store: Store, origin, served, capsys) -> None:
    from cartonstore.cli.commands import main

    carton, digest = served
    pull(store, str(carton))
    p = store.blobs.path(digest)
    os.chmod(p, 0o644)
    p.write_bytes(b"bit rot" + PAYLOAD[7:])
    root = str(store.root)
    assert main(["verify", "--root", root]) == 5
    assert main(["verify", "--repair", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "quarantined corrupt blob" in out and "refetched 1 blob(s)" in out
    assert store.blobs.path(digest).read_bytes() == PAYLOAD
    assert main(["verify", "--root", root]) == 0


@pytest.mark.parametrize("config", [{}, PARTS], ids=["one-stream", "parts"])
def test_a_body_over_max_blob_size_is_refused(store: Store, origin, served, config: dict) -> None:
    """The limit holds whether the body comes whole or in parts, and no space
    is reserved for a size the store will not take."""
    carton, digest = served
    with pytest.raises(FetchError, match="larger than 100000 bytes|over the 100000 allowed"):
        pull(store, str(carton), fast_config(max_blob_size=100_000, **config))
    assert digest not in blob_files(store) and tmp_files(store) == []


def test_a_pull_cancelled_while_parts_arrive_leaves_nothing(store: Store, origin, served) -> None:
    """Cancelled mid-way (a stalled part keeps it busy): every stream's
    thread and the hasher end, and tmp/ is empty."""
    import asyncio
    import threading

    from cartonstore.fetch.puller import Puller

    carton, digest = served
    origin.set_fault(f"/blobs/{digest}", Fault(stall_at=10_000, stall_seconds=30))

    async def run() -> None:
        async with Puller(store, fast_config(**PARTS), sources=URLS_ONLY) as p:
            task = asyncio.ensure_future(p.add(str(carton)))
            assert await wait_for_async(lambda: any(r.path == f"/blobs/{digest}" and r.range for r in origin.requests)
                                        and origin.bytes_sent_for(f"/blobs/{digest}") >= 10_000)   # a part stalls
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert [t.name for t in threading.enumerate() if t.name.startswith("cartonstore-")] == []
    assert digest not in blob_files(store) and tmp_files(store) == []


def test_a_redirect_to_the_cloud_metadata_address_is_refused(store: Store, tmp_path: Path, origin) -> None:
    """A LINKS URL on an origin the policy allows, redirecting to
    169.254.169.254 (where a cloud node's credentials are served): refused
    at the redirect, before any connection, and nothing is stored."""
    carton, digest = linked_carton(tmp_path, origin, {"model/w.bin": PAYLOAD},
                                   urls={"model/w.bin": [origin.url("/hop")]})
    digest = digest["model/w.bin"]
    for target in ("http://169.254.169.254/latest/meta-data/iam/", "http://[fd00:ec2::254]/latest/",
                   "http://[::ffff:169.254.169.254]/", "http://metadata.google.internal/computeMetadata/v1/"):
        origin.put("/hop", b"", fault=Fault(redirect_to=target))
        with pytest.raises(CartonStoreError, match="link-local or cloud metadata"):
            pull(store, str(carton))
        assert digest not in blob_files(store)
