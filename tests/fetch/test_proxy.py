"""Fetching through an HTTP proxy (issue 12 §3): a real tinyproxy on
loopback, per source kind (fetch.proxy for origins, registries.proxy for
registries), no_proxy honoured, peers never proxied."""

from __future__ import annotations

import dataclasses
import os

import pytest
from conftest import sha
from kit.fetchkit import blob_files, fast_config, linked_cartons_for_proxy, pull
from kit.origin import Origin
from kit.prockit import live_pids
from kit.proxykit import TinyProxy, needs_tinyproxy
from kit.registrykit import Registry, needs_registry

from cartonstore.errors import FetchError, InvalidInput
from cartonstore.fetch.http.config import FetchConfig, RegistryConfig
from cartonstore.fetch.http.proxies import check_no_proxy, proxy_for
from cartonstore.store import Store

PROXY = "http://proxy.lab:3128"


@pytest.mark.parametrize(("no_proxy", "url", "proxied"), [
    ((), "http://models.example.com/m.carton", True),
    (("*",), "http://models.example.com/m.carton", False),
    (("example.com",), "http://models.example.com/m.carton", False),
    (("example.com",), "http://example.com/m.carton", False),
    ((".example.com",), "https://a.b.example.com/m.carton", False),
    (("*.example.com",), "http://example.com/m.carton", True),
    (("example.com",), "http://badexample.com/m.carton", True),
    (("10.0.0.0/8",), "http://10.1.2.3:8080/b", False),
    (("10.0.0.0/8",), "http://11.1.2.3/b", True),
    (("10.0.0.0/8",), "http://ten.example/b", True),     # names are not resolved
    (("::1",), "http://[::1]:5000/v2/", False),
    (("127.0.0.1",), "http://127.0.0.1:5000/v2/", False),
])
def test_no_proxy_entries(no_proxy, url, proxied) -> None:
    check_no_proxy(no_proxy)
    config = FetchConfig(proxy=PROXY, no_proxy=no_proxy)
    assert (proxy_for(config, url, "url") == PROXY) is proxied


def test_each_kind_of_source_has_its_proxy() -> None:
    config = FetchConfig(proxy=PROXY, registries=RegistryConfig(proxy="http://reg-proxy:3128"))
    assert proxy_for(config, "http://o.example/m.carton", "url") == PROXY
    assert proxy_for(config, "http://o.example/blobs/x", "mirror") == PROXY
    assert proxy_for(config, "https://r.example/v2/m/blobs/sha256:x", "registry") == "http://reg-proxy:3128"
    assert proxy_for(config, "http://10.0.0.2:7070/v1/blobs/x", "peer") is None
    assert proxy_for(FetchConfig(), "http://o.example/m.carton", "url") is None
    assert proxy_for(dataclasses.replace(config, proxy=None), "http://o.example/m", "url") is None


@pytest.mark.parametrize("entry", ["models.lab:8080", "http://x", "a b", "10.0.0.0/99"])
def test_bad_no_proxy_entries_are_named(entry: str) -> None:
    with pytest.raises(InvalidInput, match=f"fetch.no_proxy: {entry!r} is not a host"):
        check_no_proxy((entry,))


@needs_tinyproxy
def test_origin_requests_go_through_the_proxy(tmp_path) -> None:
    blobs = {f"model/w{i}.bin": os.urandom(100_000) for i in range(3)}
    with Origin() as origin, TinyProxy(tmp_path / "proxy") as proxy, Store(tmp_path / "s") as store:
        url = linked_cartons_for_proxy(tmp_path, origin, blobs)
        result = pull(store, url, fast_config(proxy=proxy.url))
        assert result.complete and len(blob_files(store)) == 5
        forwarded = proxy.requests()
        assert f"GET {url}" in forwarded
        for data in blobs.values():
            assert f"GET {origin.url(f'/blobs/{sha(data)}')}" in forwarded
        # every request the origin saw came through the proxy (tinyproxy forwards them in origin form)
        assert len(origin.requests) == sum(1 for r in forwarded if r.startswith("GET "))
    assert not live_pids(str(tmp_path / "proxy"))


@needs_tinyproxy
def test_no_proxy_and_other_kinds_go_direct(tmp_path) -> None:
    blobs = {"model/w.bin": os.urandom(50_000)}
    with Origin() as origin, TinyProxy(tmp_path / "proxy") as proxy:
        url = linked_cartons_for_proxy(tmp_path, origin, blobs)
        with Store(tmp_path / "a") as store:   # the origin is in no_proxy
            assert pull(store, url, fast_config(proxy=proxy.url, no_proxy=("127.0.0.0/8",))).complete
        with Store(tmp_path / "b") as store:   # only registries are proxied
            cfg = fast_config(registries=RegistryConfig(proxy=proxy.url))
            assert pull(store, url, cfg).complete
        assert proxy.requests() == []
        assert origin.count(f"/blobs/{sha(blobs['model/w.bin'])}") == 2 and origin.count("/m.carton") >= 2


@needs_tinyproxy
def test_a_proxy_that_is_down_is_named_and_nothing_is_stored(tmp_path) -> None:
    blobs = {"model/w.bin": os.urandom(50_000)}
    with Origin() as origin, Store(tmp_path / "s") as store:
        url = linked_cartons_for_proxy(tmp_path, origin, blobs)
        dead = TinyProxy(tmp_path / "proxy")   # a free port, nothing started on it
        with pytest.raises(FetchError, match=f"cannot connect to 127.0.0.1:{dead.port}: connection refused"):
            pull(store, url, fast_config(proxy=dead.url))
        assert blob_files(store) == [] and origin.requests == []


@needs_tinyproxy
@needs_registry
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https-connect"])
def test_registry_requests_go_through_the_registries_proxy(tmp_path, make_carton, monkeypatch, tls) -> None:
    """Push and add through registries.proxy: plain requests forwarded as
    they are, https tunnelled with CONNECT (and still verified with the CA)."""
    from kit.ocikit import FILES, make_cert, pull, push

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    cert, key = make_cert(tmp_path / "tls") if tls else (None, None)
    with Registry(tmp_path / "registry", tls=(cert, key) if tls else None) as registry, \
            TinyProxy(tmp_path / "proxy") as proxy, Store(tmp_path / "src") as source, Store(tmp_path / "dst") as dst:
        digest = source.add(make_carton(FILES), name="m").digest
        cfg = fast_config(proxy="http://127.0.0.1:9", registries=RegistryConfig(proxy=proxy.url, ca_file=cert,
                                                                                 chunk_size=1 << 20))
        push(source, "m", registry.ref("models/m:v1"), cfg)   # fetch.proxy (a dead port) is not the registries'
        assert pull(dst, registry.ref("models/m:v1"), cfg).digest == digest
        forwarded = proxy.requests()
        if tls:
            assert forwarded and all(r == f"CONNECT {registry.authority}" for r in forwarded)
        else:
            base = f"http://{registry.authority}/v2/models/m"
            assert f"PUT {base}/manifests/v1" in forwarded and f"GET {base}/manifests/v1" in forwarded
            assert any(r.startswith(f"GET {base}/blobs/sha256:") for r in forwarded)
    assert not live_pids(str(tmp_path / "proxy"))
