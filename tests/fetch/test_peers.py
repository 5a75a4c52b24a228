"""Peers (issue 12 §2): real daemons on loopback ports that ask each other
for blobs before their origin, a real origin counting what it serves."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import MINIMAL_TOML, carton_entries, manifest_for, sha, short_dir, write_zip
from kit.origin import Origin
from kit.peerkit import TOKEN, fleet, free_port, make_pki, metric
from kit.prockit import live_pids
from kit.registrykit import Registry, needs_registry

from cartonstore.client.leases import Client
from cartonstore.fetch.sources.peers import outranks, rendezvous
from cartonstore.format.links import build_links

pytestmark = pytest.mark.xdist_group("daemons")

BLOB = 256 * 1024


def linked_cartons(tmp, origin: Origin, count: int, pool: list[bytes]) -> list[str]:
    """``count`` cartons whose files are only in LINKS, served by origin at
    /blobs/<sha256>; carton i has pool blobs 2i, 2i+1 and 2i+2 (mod the pool),
    so neighbours share one. Returns their URLs."""
    urls = []
    for i in range(count):
        files = {f"model/w{k}.bin": pool[(2 * i + k) % len(pool)] for k in range(3)}
        links = {}
        for data in files.values():
            origin.put(f"/blobs/{sha(data)}", data)
            links[sha(data)] = [origin.url(f"/blobs/{sha(data)}")]
        toml = MINIMAL_TOML.replace(b'"tiny"', f'"m{i}"'.encode())
        entries = carton_entries({"carton.toml": toml, **files}, links=build_links(links), omit=tuple(files))
        origin.put_file(f"/c{i}.carton", write_zip(tmp / f"c{i}.carton", entries))
        urls.append(origin.url(f"/c{i}.carton"))
    return urls


def verify(node) -> dict:
    out = subprocess.run([sys.executable, "-m", "cartonstore.cli", "verify", "--root", str(node.root), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_rendezvous_order_is_shared_and_spread() -> None:
    peers = [f"http://10.0.0.{i}:7070" for i in range(1, 6)]
    digests = [sha(str(i).encode()) for i in range(500)]
    firsts = [rendezvous(d, peers)[0] for d in digests]
    assert all(rendezvous(d, reversed(peers))[0] == f for d, f in zip(digests, firsts, strict=True))  # same on every node
    assert min(firsts.count(p) for p in peers) > 500 / 5 / 2  # each peer is first for its share
    # Dropping a peer moves only the blobs it was first for.
    moved = sum(rendezvous(d, peers[1:])[0] != f for d, f in zip(digests, firsts, strict=True) if f != peers[0])
    assert moved == 0
    assert outranks(digests[0], "a", "b") != outranks(digests[0], "b", "a")


@pytest.mark.slow
def test_fleet_fetches_each_blob_from_the_origin_once(tmp_path) -> None:
    """3 daemons, 5 cartons sharing blobs, each node leasing all 5 in its
    own order at the same time: the origin serves each blob once, peers the
    rest, and every node's store verifies."""
    pool = [os.urandom(BLOB) for _ in range(10)]
    with Origin() as origin, short_dir() as base, fleet(base, 3) as nodes:
        urls = linked_cartons(tmp_path, origin, 5, pool)
        orders = [urls, urls[::-1], urls[2:] + urls[:2]]
        errors: list[BaseException] = []

        def lease_all(node, order) -> None:
            try:
                client = Client(node.socket_path, timeout=60)
                for url in order:
                    lease = client.acquire(url, ttl=600)
                    assert (lease.path / "model" / "w0.bin").stat().st_size == BLOB
            except BaseException as e:  # noqa: BLE001 - raised below
                errors.append(e)

        threads = [threading.Thread(target=lease_all, args=(n, o)) for n, o in zip(nodes, orders, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        served = {sha(d): origin.count(f"/blobs/{sha(d)}") for d in pool}
        assert served == dict.fromkeys(served, 1), served
        from_peers = sum(metric(n, "cartonstore_fetched_source_bytes_total", 'source="peer"') for n in nodes)
        from_origin = sum(metric(n, "cartonstore_fetched_source_bytes_total", 'source="url"') for n in nodes)
        assert from_peers == 2 * len(pool) * BLOB   # every other node's copy came from a peer
        assert from_origin >= len(pool) * BLOB      # the blobs once, and the 15 carton zips' metadata
        for node in nodes:
            report = verify(node)
            assert report["ok"] and report["blobs_checked"] >= len(pool) + 10, report


@pytest.mark.slow
def test_peer_without_the_blob_is_skipped_and_a_dead_one_marked_down(tmp_path) -> None:
    """One peer is up and lacks the blob (404 at once), one port has nothing
    listening, one accepts connections and never answers: the node asks,
    gives up on the silent one within the timeout, marks the dead ones down,
    and takes the blob from the origin."""
    silent = __import__("socket").socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    dead = f"http://127.0.0.1:{free_port()}"
    hung = f"http://127.0.0.1:{silent.getsockname()[1]}"
    pool = [os.urandom(BLOB) for _ in range(4)]
    try:
        with Origin() as origin, short_dir() as base, fleet(
                base, 2, peers_of=lambda i, urls: [u for u in urls if u != urls[i]] + [dead, hung]) as nodes:
            urls = linked_cartons(tmp_path, origin, 2, pool)
            started = time.monotonic()
            Client(nodes[0].socket_path, timeout=60).acquire(urls[0], ttl=600)
            first = time.monotonic() - started
            started = time.monotonic()
            Client(nodes[0].socket_path, timeout=60).acquire(urls[1], ttl=600)
            second = time.monotonic() - started
            log = nodes[0].stop_and_read()
    finally:
        silent.close()
    assert f"peer {hung}: did not answer within 7s; not asked again for 30s" in log, log[-2000:]
    assert f"peer {dead}: cannot connect to 127.0.0.1:{dead.rsplit(':', 1)[1]}: connection refused; not asked again" \
        in log, log[-2000:]
    assert first < 2 + 5 + 10   # the silent peer cost one timeout (timeout + wait), not one per blob
    assert second < first       # marked down: not asked again
    assert all(origin.count(f"/blobs/{sha(d)}") == 1 for d in pool)


def test_blobs_over_tcp_need_the_peer_token(tmp_path) -> None:
    pool = [os.urandom(1000)]
    with Origin() as origin, short_dir() as base, fleet(base, 1) as (node,):
        (url,) = linked_cartons(tmp_path, origin, 1, pool)
        Client(node.socket_path, timeout=60).acquire(url, ttl=600)
        blob = f"{node.http_url}/v1/blobs/{sha(pool[0])}"
        for headers, why in (({}, "needs this fleet's peer token"),
                             ({"Authorization": "Bearer wrong"}, "the one sent is not it"),
                             ({"Authorization": f"Basic {TOKEN}"}, "the one sent is not it")):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(blob, headers=headers), timeout=10)
            assert e.value.code == 401 and why in json.loads(e.value.read())["error"]
            assert e.value.headers["WWW-Authenticate"] == 'Bearer realm="cartonstore"'
        ok = urllib.request.urlopen(urllib.request.Request(blob, headers={"Authorization": f"Bearer {TOKEN}"}),
                                    timeout=10)
        assert ok.read() == pool[0]
        # This host's callers, on the Unix socket, need no token.
        import http.client

        from cartonstore.client.wire import UnixHTTPConnection

        conn = UnixHTTPConnection(node.socket_path, 10)
        conn.request("GET", f"/v1/blobs/{sha(pool[0])}")
        assert conn.getresponse().read() == pool[0]
        conn.close()
        assert http.client  # imported for the connection class's base


def test_a_node_with_the_wrong_token_fetches_from_the_origin(tmp_path) -> None:
    """A peer that refuses this node's token is marked down (and logged as
    such); the blob still comes, from the origin."""
    pool = [os.urandom(BLOB)]
    with Origin() as origin, short_dir() as base:
        urls = linked_cartons(tmp_path, origin, 1, pool)
        with fleet(base / "a", 1, peers_of=lambda i, u: []) as (holder,):
            Client(holder.socket_path, timeout=60).acquire(urls[0], ttl=600)
            with fleet(base / "b", 1, token="another-token", peers_of=lambda i, u: [holder.http_url]) as (node,):
                Client(node.socket_path, timeout=60).acquire(urls[0], ttl=600)
                log = node.stop_and_read()
    assert "refused this node's peers.token" in log
    assert origin.count(f"/blobs/{sha(pool[0])}") == 2



@pytest.mark.slow
def test_a_zip_entry_comes_from_a_peer_not_the_origin(tmp_path) -> None:
    """A carton whose big file is inside its zip: the second node reads the
    zip's directory from the origin, and the file from the first node."""
    big = os.urandom(2 << 20)
    entries = carton_entries({"carton.toml": MINIMAL_TOML, "model/big.bin": big})
    with Origin() as origin, short_dir() as base:
        origin.put_file("/big.carton", write_zip(tmp_path / "big.carton", entries))
        with fleet(base, 2) as nodes:
            Client(nodes[0].socket_path, timeout=60).acquire(origin.url("/big.carton"), ttl=600)
            before = origin.bytes_sent
            lease = Client(nodes[1].socket_path, timeout=60).acquire(origin.url("/big.carton"), ttl=600)
            assert (lease.path / "model" / "big.bin").read_bytes() == big
            assert origin.bytes_sent - before < len(big) // 4
            assert metric(nodes[1], "cartonstore_fetched_source_bytes_total", 'source="peer"') == len(big)
            assert verify(nodes[1])["ok"]
        assert not live_pids(str(base))


@pytest.mark.slow
def test_peers_over_mutual_tls(tmp_path) -> None:
    """https listeners asking for a client certificate, peers showing theirs:
    the blob comes from the peer; /v1/blobs refuses a client without a
    certificate from the fleet's CA, and a stranger's cannot connect."""
    import ssl

    pki = make_pki(tmp_path / "pki")
    tls = (f'[server]\ntls_cert = "{pki["node.pem"]}"\ntls_key = "{pki["node.key"]}"\n'
           f'tls_client_ca = "{pki["ca.pem"]}"\n')
    peers = (f'tls_cert = "{pki["node.pem"]}"\ntls_key = "{pki["node.key"]}"\nca_file = "{pki["ca.pem"]}"\n')
    pool = [os.urandom(BLOB)]
    with Origin() as origin, short_dir() as base:
        (url,) = linked_cartons(tmp_path, origin, 1, pool)
        with fleet(base, 2, token="", scheme="https", extra=tls, peer_extra=peers) as nodes:
            assert nodes[0].http_url.startswith("https://")
            for node in nodes:
                Client(node.socket_path, timeout=60).acquire(url, ttl=600)
            assert origin.count(f"/blobs/{sha(pool[0])}") == 1
            assert metric_tls(nodes[1], pki, "cartonstore_fetched_source_bytes_total", 'source="peer"') == BLOB
            blob = f"{nodes[0].http_url}/v1/blobs/{sha(pool[0])}"
            anonymous = ssl.create_default_context(cafile=str(pki["ca.pem"]))
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(blob, context=anonymous, timeout=10)
            assert e.value.code == 403 and "server.tls_client_ca" in json.loads(e.value.read())["error"]
            member = ssl.create_default_context(cafile=str(pki["ca.pem"]))
            member.load_cert_chain(str(pki["node.pem"]), str(pki["node.key"]))
            assert urllib.request.urlopen(blob, context=member, timeout=10).read() == pool[0]
            stranger = ssl.create_default_context(cafile=str(pki["ca.pem"]))
            stranger.load_cert_chain(str(pki["stranger.pem"]), str(pki["stranger.key"]))
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                urllib.request.urlopen(blob, context=stranger, timeout=10).read()
        assert not live_pids(str(base))


def metric_tls(node, pki, name: str, labels: str) -> float:
    """Over the node's Unix socket: over TCP a fleet certificate opens /v1/blobs alone."""
    from kit.daemonkit import call

    status, text = call(node, "GET", "/metrics")
    assert status == 200, text
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{name}{{{labels}}} "))


def test_a_fleet_certificate_opens_blobs_alone(tmp_path) -> None:
    """mTLS between peers: the fleet's certificate fetches blobs but loads
    nothing (a peer must not be able to load code on its neighbours)."""
    import ssl

    pki = make_pki(tmp_path / "pki")
    tls = (f'[server]\ntls_cert = "{pki["node.pem"]}"\ntls_key = "{pki["node.key"]}"\n'
           f'tls_client_ca = "{pki["ca.pem"]}"\n')
    with short_dir() as base, fleet(base, 1, token="", scheme="https", extra=tls) as (node,):
        member = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        member.load_cert_chain(str(pki["node.pem"]), str(pki["node.key"]))
        request = urllib.request.Request(f"{node.http_url}/v2/repository/models/x/load", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, context=member, timeout=10)
        assert e.value.code == 403 and "authorizes /v1/blobs only" in json.loads(e.value.read())["error"]


def test_a_probe_names_a_bad_wait_and_answers_at_once_for_what_it_has_or_lacks(tmp_path) -> None:
    pool = [os.urandom(1000)]
    with Origin() as origin, short_dir() as base:
        with fleet(base, 1) as (node,):
            (url,) = linked_cartons(tmp_path, origin, 1, pool)
            Client(node.socket_path, timeout=60).acquire(url, ttl=600)
            auth = {"Authorization": f"Bearer {TOKEN}", "Carton-Node": "n2", "Carton-Wait": "5"}

            def head(digest: str, **headers: str) -> int:
                request = urllib.request.Request(f"{node.http_url}/v1/blobs/{digest}", method="HEAD",
                                                 headers={**auth, **headers})
                try:
                    return urllib.request.urlopen(request, timeout=10).status
                except urllib.error.HTTPError as e:
                    return e.code

            started = time.monotonic()
            assert head(sha(pool[0])) == 200 and head(sha(b"absent")) == 404
            assert time.monotonic() - started < 2   # nothing in flight: no wait
            assert head(sha(pool[0]), **{"Carton-Wait": "soon"}) == 400
            assert head("not-a-digest") == 400
        assert not live_pids(str(base))


@needs_registry
def test_a_registry_carton_takes_its_blobs_from_a_peer(tmp_path, make_carton, monkeypatch) -> None:
    """A node adds an OCI carton; a second one (in this process) adding it
    takes every layer from the first node and only the manifest from the registry."""
    from kit.fetchkit import fast_config
    from kit.ocikit import FILES, pull

    from cartonstore.fetch.http.config import PeerConfig
    from cartonstore.store import Store

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    with Registry(tmp_path / "registry") as registry, short_dir() as base:
        with Store(tmp_path / "src") as source:
            source.add(make_carton(FILES), name="m")
            from kit.ocikit import config, push

            push(source, "m", registry.ref("models/m:v1"), config())
        with fleet(base, 1, peers_of=lambda i, u: []) as (node,):
            Client(node.socket_path, timeout=60).acquire(registry.ref("models/m:v1"), ttl=600)
            cfg = dataclasses.replace(fast_config(), peers=PeerConfig(urls=(node.http_url,), token=TOKEN))
            with Store(tmp_path / "dst") as dst:
                result = pull(dst, registry.ref("models/m:v1"), cfg)
            assert result.complete and result.sources["registry"]["blobs"] == 0
            assert result.sources["peer"]["blobs"] == result.blobs_fetched >= 4
        assert not live_pids(str(base))


@pytest.mark.slow
def test_nodes_adding_one_zip_carton_at_once_share_its_entries(tmp_path) -> None:
    """Three nodes add the same carton (its files inside its zip) at the same
    moment. Each blob ranks a different node first, and a carton's blobs
    commit together, so each node waits on others for some blobs while they
    wait on it for others: a staged blob is served before its carton
    commits, and each node reads its blobs from the zip without waiting for
    the rest, so none waits for ever and the zip's entries are read once."""
    files = {f"model/w{i}.bin": os.urandom(BLOB) for i in range(6)}
    entries = carton_entries({"carton.toml": MINIMAL_TOML, **files})
    with Origin() as origin, short_dir() as base:
        carton = write_zip(tmp_path / "six.carton", entries)
        origin.put_file("/six.carton", carton)
        with fleet(base, 3) as nodes:
            errors: list[BaseException] = []

            def lease(node) -> None:
                try:
                    Client(node.socket_path, timeout=60).acquire(origin.url("/six.carton"), ttl=600)
                except BaseException as e:  # noqa: BLE001 - raised below
                    errors.append(e)

            threads = [threading.Thread(target=lease, args=(n,)) for n in nodes]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors and not any(t.is_alive() for t in threads), errors
            total = sum(len(d) for d in files.values())
            assert sum(metric(n, "cartonstore_fetched_source_bytes_total", 'source="peer"') for n in nodes) == 2 * total
            assert origin.bytes_sent < total + 3 * 256 * 1024   # the entries once, and each node's directory reads
            for node in nodes:
                assert verify(node)["ok"]
        assert not live_pids(str(base))


@pytest.mark.slow
def test_when_the_fetching_node_fails_the_nodes_waiting_on_it_are_told(tmp_path) -> None:
    """The blob is gone from the origin. The node that goes there fails, and
    the probes it holds are answered "absent" at once (not when the 30 s
    wait runs out): every node then tries the origin itself and fails,
    naming the blob."""
    pool = [os.urandom(BLOB)]
    with Origin() as origin, short_dir() as base:
        (url,) = linked_cartons(tmp_path, origin, 1, pool)
        origin.remove(f"/blobs/{sha(pool[0])}")
        with fleet(base, 3, wait="30s") as nodes:
            failures: list[str] = []

            def lease(node) -> None:
                try:
                    Client(node.socket_path, timeout=120).acquire(url, ttl=600)
                except Exception as e:  # noqa: BLE001 - each node must fail
                    failures.append(str(e))

            threads = [threading.Thread(target=lease, args=(n,)) for n in nodes]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert time.monotonic() - started < 20
            assert len(failures) == 3 and all(sha(pool[0]) in f and "404" in f for f in failures), failures
            assert origin.count(f"/blobs/{sha(pool[0])}") == 3
        assert not live_pids(str(base))


@pytest.mark.slow
def test_a_peer_that_answers_not_yet_for_ever_is_waited_for_peers_wait_in_all(tmp_path) -> None:
    """A peer whose own fetch is stuck answers 202 to every probe (holding
    each a little): the node stops asking it once peers.wait has passed in
    all, not per answer, and takes the blob from its origin."""
    import http.server

    probes = []

    class Stuck(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # http.server's name
            probes.append(float(self.headers.get("Carton-Wait", "0")))
            time.sleep(0.2)
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    stuck = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=stuck.serve_forever, daemon=True).start()
    pool = [os.urandom(BLOB) for _ in range(3)]
    try:
        with Origin() as origin, short_dir() as base, fleet(
                base, 1, peers_of=lambda i, urls: [f"http://127.0.0.1:{stuck.server_address[1]}"],
                wait="2s") as nodes:
            url = linked_cartons(tmp_path, origin, 1, pool)[0]
            started = time.monotonic()
            Client(nodes[0].socket_path, timeout=60).acquire(url, ttl=600)
            took = time.monotonic() - started
            log = nodes[0].stop_and_read()
    finally:
        stuck.shutdown()
        stuck.server_close()
    assert took < 3 * (2 + 1), took   # three blobs, each waited for 2 s at most (not for ever)
    assert len(probes) >= 6 and all(0 < wait <= 2 for wait in probes), probes
    assert min(probes) < 1.9   # a probe after the first offers the peer what is left of the wait, not a new one
    assert "was still fetching" in log and "after peers.wait (2s in all)" in log, log[-2000:]
    assert all(origin.count(f"/blobs/{sha(d)}") == 1 for d in pool)


def test_the_source_figures_are_the_stores_whoever_adds(tmp_path) -> None:
    """A node takes a carton's big file from a peer: its /metrics counts it
    as the peer's; a CLI process adding to the same store counts into the
    figures the daemon shows, and `ls --sources` reads the same."""
    big = os.urandom(BLOB)
    small = {"carton.toml": MINIMAL_TOML}
    other = {**small, "model/o.bin": b"o" * 3000}
    with Origin() as origin, short_dir() as base:
        url = origin.put_file("/big.carton", write_zip(tmp_path / "big.carton",
                                                       carton_entries({**small, "model/big.bin": big})))
        other_url = origin.put_file("/other.carton", write_zip(tmp_path / "other.carton", carton_entries(other)))
        with fleet(base, 2) as nodes:
            Client(nodes[0].socket_path, timeout=60).acquire(url, ttl=600)
            Client(nodes[1].socket_path, timeout=60).acquire(url, ttl=600)

            def figure(kind: str, outcome: str = "fetched") -> float:
                return metric(nodes[1], "cartonstore_source_bytes_total", f'kind="{kind}",outcome="{outcome}"')

            assert figure("peer") == len(big)
            from_url = len(MINIMAL_TOML) + len(manifest_for({**small, "model/big.bin": big}))
            assert figure("url") == from_url
            added = subprocess.run([sys.executable, "-m", "cartonstore.cli", "add", other_url, "--root",
                                    str(nodes[1].root), "--progress", "none"], capture_output=True, text=True,
                                   timeout=60)
            assert added.returncode == 0, added.stderr
            assert figure("url") == from_url + len(other["model/o.bin"]) + len(manifest_for(other))
            assert figure("url", "reused") == len(MINIMAL_TOML)   # the carton.toml both cartons have
            listed = subprocess.run([sys.executable, "-m", "cartonstore.cli", "ls", "--sources", "--json", "--root",
                                     str(nodes[1].root)], capture_output=True, text=True, timeout=60)
            assert json.loads(listed.stdout)["peer"] == {"fetched_bytes": len(big), "fetched_blobs": 1,
                                                         "reused_bytes": 0, "reused_blobs": 0}
        assert not live_pids(str(base))
