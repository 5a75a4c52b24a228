"""URLs a carton names are its author's (issue 37, item 6): LINKS that point
at the host's loopback, private or other non-global addresses, in any form,
directly, by a name that resolves there, by a redirect or a token realm, are
"refused by policy" with nothing sent (the listener below counts the
connections it accepts), unless fetch.allow_private_links; a caller's own
URL, the mirrors and the registry a carton was pulled from keep today's rules.

The suite allows such URLs (conftest.py, fetchkit.fast_config): each test
here sets the policy it means.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import FIXTURE_CARTON, MINIMAL_TOML, carton_entries, sha, short_dir, write_zip
from kit.fetchkit import URLS_ONLY, fast_config, materialize, pull

from cartonstore.config.pulling import standard_sources
from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.fetch.http.addresses import address_class, host_class
from cartonstore.fetch.http.policy import RefusedByPolicy, UrlPolicy
from cartonstore.fetch.http.source_kinds import SourceKinds
from cartonstore.fetch.sources.registry_mirrors import pulled_from
from cartonstore.format.links import build_links
from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy

PAYLOAD = b"weights " * 5000
DIGEST = sha(PAYLOAD)
STRICT = UrlPolicy()
ALLOWING = UrlPolicy(allow_private_links=True)


class Listener:
    """A real HTTP server on 127.0.0.1 and [::1], one port, that counts the
    connections each address accepts; serves ``bodies``, ``redirects`` (302)
    and ``challenges`` (401 with that WWW-Authenticate) by path."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.challenges: dict[str, str] = {}
        self.accepted = {"127.0.0.1": 0, "::1": 0}
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Listener:
        for _ in range(20):   # ::1 on the port 127.0.0.1 got; another test may hold it there
            v4 = _CountingServer(self, "127.0.0.1", 0, socket.AF_INET)
            try:
                v6 = _CountingServer(self, "::1", v4.server_address[1], socket.AF_INET6)
            except OSError:
                v4.server_close()
                continue
            self._servers = [v4, v6]
            break
        else:
            raise RuntimeError("no port free on both 127.0.0.1 and ::1")
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                         for s in self._servers]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(10)

    @property
    def port(self) -> int:
        return self._servers[0].server_address[1]

    @property
    def connections(self) -> int:
        with self._lock:
            return sum(self.accepted.values())

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def count(self, address: str) -> None:
        with self._lock:
            self.accepted[address] += 1


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: Listener, host: str, port: int, family: int) -> None:
        self.address_family = family
        self.owner = owner
        self.host = host
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        TCPServer.server_bind(self)   # HTTPServer's looks its own name up in DNS
        self.server_name, self.server_port = self.host, self.server_address[1]

    def get_request(self) -> tuple[socket.socket, Any]:
        accepted = super().get_request()
        self.owner.count(self.host)
        return accepted


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        owner: Listener = self.server.owner  # type: ignore[attr-defined]  # set by _CountingServer
        path = urlsplit(self.path).path   # as a proxy, an absolute URL
        if path in owner.redirects:
            self._answer(302, b"", Location=owner.redirects[path])
        elif path in owner.challenges:
            self._answer(401, b"", **{"WWW-Authenticate": owner.challenges[path]})
        elif path in owner.bodies:
            self._answer(200, owner.bodies[path])
        else:
            self._answer(404, b"")

    def _answer(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as served:
        served.bodies[f"/blobs/{DIGEST}"] = PAYLOAD
        yield served


def linking(tmp_path: Path, *urls: str, name: str = "linked.carton") -> Path:
    """A carton whose model/w.bin (PAYLOAD) is only in LINKS, at ``urls``."""
    files = {"carton.toml": MINIMAL_TOML, "model/w.bin": PAYLOAD}
    return write_zip(tmp_path / name, carton_entries(files, links=build_links({DIGEST: list(urls)}),
                                                     omit=("model/w.bin",)))


def refused(store: Store, carton: Path, policy: UrlPolicy = STRICT, *, sources: SourceKinds = URLS_ONLY,
            **config) -> str:
    with pytest.raises(CartonStoreError) as caught:
        pull(store, str(carton), fast_config(policy=policy, **config), sources=sources)
    message = caught.value.message
    assert "refused by policy" in message and "fetch.allow_private_links = true" in message, message
    assert not store.blobs.has(DIGEST)
    return message


# -- the rule, pure ----------------------------------------------------------------------------

CLASSES = [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("[::1]", "loopback"), ("localhost", "loopback"),
    ("LocalHost.", "loopback"), ("api.localhost", "loopback"), ("2130706433", "loopback"),
    ("0x7f.1", "loopback"), ("0x7f000001", "loopback"), ("017700000001", "loopback"), ("127.1", "loopback"),
    ("[::ffff:127.0.0.1]", "loopback"), ("[::ffff:7f00:1]", "loopback"), ("[64:ff9b::7f00:1]", "loopback"),
    ("[2002:7f00:1::]", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("[fd00::1]", "private"), ("[::ffff:10.0.0.1]", "private"),
    ("169.254.169.254", "link-local"), ("[fe80::1]", "link-local"), ("0.0.0.0", "unspecified"),
    ("[::]", "unspecified"), ("224.0.0.1", "multicast"), ("[ff02::1]", "multicast"),
    ("100.64.0.1", "non-global"), ("192.0.2.1", "non-global"), ("240.0.0.1", "non-global"),
]


# What a resolver reads as 127.0.0.1 and check() refuses whoever names it (policy.py).
LEGACY_IPV4 = ("2130706433", "0x7f.1", "0x7f000001", "017700000001", "127.1")


@pytest.mark.parametrize(("host", "kind"), CLASSES, ids=[h for h, _ in CLASSES])
def test_a_link_to_a_non_global_address_in_any_form_is_refused_by_policy(host: str, kind: str) -> None:
    with pytest.raises(RefusedByPolicy, match=f"refused by policy: .* an? {kind} address") as caught:
        STRICT.check_link(f"http://user:secret@{host}:6379/x?sig=abc")
    assert "secret" not in caught.value.message and "sig=abc" not in caught.value.message
    # With the setting, a link is checked as any URL is (metadata and legacy forms stay refused).
    assert _outcome(ALLOWING.check_link, f"http://{host}:6379/x") == _outcome(ALLOWING.check, f"http://{host}:6379/x")


def _outcome(check, url: str) -> str:
    try:
        return check(url)
    except InvalidInput as e:
        return e.message


@pytest.mark.parametrize("host", ["8.8.8.8", "[2606:4700::1]", "[::ffff:8.8.8.8]", "models.example.com",
                                  "localhost.example.com"])
def test_a_link_to_a_global_address_or_an_ordinary_name_passes(host: str) -> None:
    assert STRICT.check_link(f"https://{host}/b") == f"https://{host}/b"


def test_allow_hosts_naming_a_host_lets_links_reach_it_and_only_it() -> None:
    policy = UrlPolicy(allow_hosts=("127.0.0.1", "10.0.0.0/8", "*.lab"))
    assert policy.check_link("http://127.0.0.1:1/b") and policy.check_link("http://10.9.9.9/b")
    with pytest.raises(CartonStoreError, match="refused by policy"):
        policy.check_link("http://127.0.0.2/b")
    assert host_class("build.lab") is None and address_class(ipaddress.ip_address("10.0.0.1")) == "private"


def test_a_registry_blob_url_is_the_callers_only_for_the_repository_pulled() -> None:
    blob = "http://127.0.0.1:5000/v2/models/m/blobs/sha256:" + "a" * 64
    assert pulled_from(blob, ["oci://127.0.0.1:5000/models/m:v1@sha256:" + "b" * 64])
    assert pulled_from(blob, ["oci://127.0.0.1:5000/models/m@sha256:" + "b" * 64])
    for source in ("oci://127.0.0.1:5000/models/mx:v1", "oci://127.0.0.1:5001/models/m:v1",
                   "oci://127.0.0.1:5000/models:v1", "/srv/cartons/m.carton", "http://127.0.0.1:5000/models/m:v1"):
        assert not pulled_from(blob, [source]), source
    assert not pulled_from("http://127.0.0.1:5000/blobs/" + "a" * 64, ["oci://127.0.0.1:5000/blobs:v1"])


# -- real fetches -----------------------------------------------------------------------------

FORMS = ["127.0.0.1", "[::1]", "localhost", "api.localhost", "[::ffff:127.0.0.1]", *LEGACY_IPV4]


@pytest.mark.parametrize("host", FORMS)
def test_links_to_loopback_are_refused_with_no_connection(tmp_path: Path, listener: Listener, host: str) -> None:
    carton = linking(tmp_path, listener.url(f"/blobs/{DIGEST}", host))
    with Store(tmp_path / "s") as store:
        message = refused(store, carton)
    assert "loopback" in message and "cannot connect" not in message
    assert listener.connections == 0


def test_the_error_is_the_same_for_an_open_and_a_closed_port(tmp_path: Path, listener: Listener) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]   # nothing listens there once closed
    errors = []
    for port in (listener.port, closed):
        with Store(tmp_path / f"s{port}") as store:
            errors.append(refused(store, linking(tmp_path, f"http://127.0.0.1:{port}/blobs/{DIGEST}",
                                                 name=f"{port}.carton")).replace(str(port), "PORT"))
    assert errors[0] == errors[1] and listener.connections == 0


def test_a_links_url_shaped_like_a_registry_blob_is_refused_too(tmp_path: Path, listener: Listener) -> None:
    carton = linking(tmp_path, listener.url(f"/v2/models/m/blobs/sha256:{DIGEST}"))
    with Store(tmp_path / "s") as store:
        refused(store, carton)
    assert listener.connections == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "localhost", "[::ffff:127.0.0.1]"])
def test_with_allow_private_links_the_same_carton_is_fetched(tmp_path: Path, listener: Listener, host: str) -> None:
    carton = linking(tmp_path, listener.url(f"/blobs/{DIGEST}", host))
    with Store(tmp_path / "s") as store:
        assert pull(store, str(carton), fast_config(policy=ALLOWING)).complete
        assert store.blobs.has(DIGEST)
    assert listener.connections >= 1


def _loopback_name() -> str:
    """A name (not localhost) that resolves here only to loopback: the host's
    own name on most machines (/etc/hosts). Tests may not edit /etc/hosts."""
    for name in (socket.gethostname(), "ip6-localhost", "ip6-loopback"):
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
        if addresses and host_class(name.lower()) is None and \
                all(ipaddress.ip_address(a).is_loopback for a in addresses):
            return name
    pytest.skip("no name but localhost resolves only to loopback on this machine")


def test_a_name_that_resolves_to_loopback_is_refused_at_connect(tmp_path: Path, listener: Listener) -> None:
    name = _loopback_name()
    carton = linking(tmp_path, listener.url(f"/blobs/{DIGEST}", name))
    with Store(tmp_path / "s") as store:
        message = refused(store, carton)
        assert f"{name}, which resolves only to loopback addresses" in message and "127.0.0.1" not in message
        assert listener.connections == 0
        assert pull(store, str(carton), fast_config(policy=ALLOWING)).complete   # the name itself works
        store.collect(GcPolicy(max_size=1, grace=0.0))
        named = UrlPolicy(allow_hosts=(name,))   # the operator names it: wherever it points
        assert (materialize(store, "tiny", fast_config(policy=named)) / "model/w.bin").read_bytes() == PAYLOAD
    assert listener.connections >= 2


def test_a_redirect_or_a_token_realm_to_loopback_is_refused(tmp_path: Path, listener: Listener) -> None:
    listener.redirects["/hop"] = listener.url(f"/blobs/{DIGEST}", "[::1]")
    listener.challenges["/locked"] = f'Bearer realm="{listener.url("/token", "[::1]")}",service="s"'
    # The first hop, to a name that resolves nowhere here, goes through fetch.proxy (the
    # listener on 127.0.0.1 answers as the proxy would for it); what it answers names ::1.
    for path in ("/hop", "/locked"):
        with Store(tmp_path / f"s{path[1:]}") as store:
            carton = linking(tmp_path, f"http://models.example{path}", name=f"{path[1:]}.carton")
            # the standard set: its answerer of 401 challenges asks the token realm
            assert "[::1]" in refused(store, carton, sources=standard_sources(), proxy=listener.url(""))
    assert listener.accepted["::1"] == 0 and listener.accepted["127.0.0.1"] >= 2


def test_blobs_gc_evicted_come_back_from_links_only_with_the_setting(tmp_path: Path, listener: Listener) -> None:
    carton = linking(tmp_path, listener.url(f"/blobs/{DIGEST}"))
    with Store(tmp_path / "s") as store:
        digest = pull(store, str(carton), fast_config(policy=ALLOWING)).digest
        store.collect(GcPolicy(max_size=1, grace=0.0))
        assert not store.blobs.has(DIGEST)
        seen = listener.connections
        with pytest.raises(CartonStoreError, match="refused by policy") as caught:
            materialize(store, digest, fast_config(policy=STRICT))
        assert "loopback" in caught.value.message and listener.connections == seen
        assert (materialize(store, digest, fast_config(policy=ALLOWING)) / "model/w.bin").read_bytes() == PAYLOAD


def test_a_callers_url_and_the_mirrors_on_loopback_need_no_setting(tmp_path: Path, listener: Listener) -> None:
    listener.bodies["/m.carton"] = linking(tmp_path, listener.url("/links-only")).read_bytes()
    listener.bodies[f"/mirror/{DIGEST}"] = PAYLOAD
    with Store(tmp_path / "s") as store:
        result = pull(store, listener.url("/m.carton"),
                      fast_config(policy=STRICT, mirrors=(listener.url("/mirror"),)))
        assert result.complete and result.sources["mirror"]["blobs"] == 1 and store.blobs.has(DIGEST)


def test_through_a_proxy_links_are_refused_by_name_and_by_what_the_name_resolves_to(
        tmp_path: Path, listener: Listener) -> None:
    from kit.proxykit import BINARY, TinyProxy

    if BINARY is None:
        pytest.skip("tinyproxy is not installed")
    with TinyProxy(tmp_path / "proxy") as proxy:
        for host in ("localhost", _loopback_name()):
            with Store(tmp_path / f"s-{host}") as store:
                refused(store, linking(tmp_path, listener.url(f"/blobs/{DIGEST}", host), name=f"{host}.carton"),
                        proxy=proxy.url)
        assert proxy.requests() == [] and listener.connections == 0
        with Store(tmp_path / "s") as store:   # allowed, the proxy is asked: it resolves and connects
            assert pull(store, str(linking(tmp_path, listener.url(f"/blobs/{DIGEST}", "localhost"))),
                        fast_config(policy=ALLOWING, proxy=proxy.url)).complete
        assert proxy.requests() and listener.connections >= 1


def test_blobs_of_a_carton_pulled_from_a_loopback_registry_come_back_without_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_carton) -> None:
    from kit.ocikit import FILES, config, materialize, pull, push
    from kit.registrykit import BINARY, Registry

    if BINARY is None:
        pytest.skip("docker-registry is not installed")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    strict = dataclasses.replace(config(), policy=STRICT)
    with Registry(tmp_path / "registry") as registry, Store(tmp_path / "source") as source, \
            Store(tmp_path / "a") as store:
        source.add(make_carton(FILES), name="m")
        push(source, "m", registry.ref("models/m:v1"), strict)
        pull(store, registry.ref("models/m:v1"), strict, name="x")
        store.collect(GcPolicy(max_size=1, grace=0.0))
        assert store.missing_blobs(store.resolve("x"))
        assert (materialize(store, "x", strict) / "model/weights.bin").read_bytes() == FILES["model/weights.bin"]


def test_the_daemon_refuses_a_cartons_loopback_links_and_loads_a_callers_loopback_url(
        tmp_path: Path, listener: Listener) -> None:
    from kit.daemonkit import DaemonProcess, call

    from cartonstore.cli.commands import main

    listener.bodies["/fx.carton"] = FIXTURE_CARTON.read_bytes()
    with short_dir() as short, DaemonProcess(Path(short) / "root", env={"CARTONSTORE_ALLOW_PRIVATE_LINKS": ""}) as d:
        assert main(["add", str(linking(tmp_path, listener.url(f"/blobs/{DIGEST}"))), "--lazy", "--name", "lazy",
                     "--root", str(d.root), "--progress", "none"]) == 0
        status, body = call(d, "POST", "/v1/leases", json={"model": "lazy"})
        assert status >= 400 and "refused by policy" in body["error"], body
        assert listener.connections == 0
        status, body = call(d, "POST", "/v2/repository/models/byurl/load",
                            json={"parameters": {"source": listener.url("/fx.carton")}})
        assert status == 200, body
