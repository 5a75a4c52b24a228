"""Settings: defaults, the file, the environment, overrides, and every bad value.

Also checks the shipped config/cartonstore.toml (it must be the defaults, all
of them, each explained) and the systemd units in systemd/.
"""

from __future__ import annotations

import configparser
import dataclasses
import itertools
import math
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import tomli
import tomli_w

from cartonstore.config.load import (
    CONFIG_ENV,
    ENV_VARS,
    Config,
    FetchSettings,
    load_config,
    setting_keys,
)
from cartonstore.config.load import (
    duration_text as format_duration,
)
from cartonstore.config.load import (
    size_text as format_size,
)
from cartonstore.errors import InvalidInput
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.content_encoding import DEFAULT_ACCEPT_ENCODING
from cartonstore.fetch.http.policy import UrlPolicy
from cartonstore.format.units import parse_duration
from cartonstore.zipfmt import ZipLimits

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "config" / "cartonstore.toml"
UNITS = REPO / "systemd"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No CARTONSTORE_* variables leak in; HOME is a temp dir, and
    XDG_CACHE_HOME its .cache, so that the default root is in it for root
    too (root's own default, /var/lib/cartonstore: tests/cli/test_default_store.py)."""
    for var in (*ENV_VARS, CONFIG_ENV):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    return home


def get(config: Config, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def write_setting(tmp_path: Path, key: str, literal: str) -> Path:
    section, _, name = key.partition(".")
    path = tmp_path / "cartonstore.toml"
    path.write_text(f"[{section}]\n{name} = {literal}\n")
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cartonstore.toml"
    path.write_text(text)
    return path


# -- defaults ------------------------------------------------------------------------

DEFAULTS = {
    "store.root": None,  # HOME/.cache/cartonstore, checked below
    "server.socket": None,
    "server.socket_mode": 0o660,
    "server.socket_group": "",
    "server.listen": "",
    "server.allow_remote_listen": False,
    "server.grpc": True,
    "server.grpc_socket": None,
    "server.grpc_listen": "",
    "server.restore_loaded": True,
    "server.id": "",
    "server.log_format": "text",
    "server.log_level": "info",
    "server.access_log": False,
    "server.max_request_size": 256 * MiB,
    "server.max_buffered": GiB,
    "server.max_connections": 4096,
    "server.max_connections_per_peer": 256,
    "server.head_timeout": 10.0,
    "server.idle_timeout": 75.0,
    "server.shared_memory_over_tcp": False,
    "server.allow_tcp_local_sources": False,
    "server.arena_size": GiB,
    "server.check_workers": None,
    "server.shutdown_timeout": 10.0,
    "server.tls_cert": None,
    "server.tls_key": None,
    "server.tls_client_ca": None,
    "server.token": "",
    "server.token_file": None,
    "leases.default_ttl": 60.0,
    "leases.max_ttl": 3600.0,
    "leases.pin_ttl": 120.0,
    "fetch.accept_encoding": DEFAULT_ACCEPT_ENCODING,
    "fetch.connect_timeout": 10.0,
    "fetch.stall_timeout": 30.0,
    "fetch.retries": 4,
    "fetch.backoff_base": 0.5,
    "fetch.backoff_max": 30.0,
    "fetch.max_concurrency": 8,
    "fetch.parallel_threshold": GiB,
    "fetch.parallel_parts": 4,
    "fetch.coalesce_gap": 1 * MiB,
    "fetch.lock_timeout": 3600.0,
    "fetch.max_blob_size": None,
    "fetch.mirrors": (),
    "fetch.proxy": None,
    "fetch.no_proxy": (),
    "fetch.allow_hosts": (),
    "fetch.deny_hosts": (),
    "fetch.max_redirects": 5,
    "fetch.allow_private_links": False,
    "registries.insecure": (),
    "registries.ca_file": None,
    "registries.auth_file": None,
    "registries.chunk_size": 64 << 20,
    "registries.proxy": None,
    "registries.mirrors": {},
    "registries.mirror_down_for": 60.0,
    "hf.endpoint": "https://huggingface.co",
    "hf.token": "",
    "hf.token_file": None,
    "limits.zip_max_entries": 200_000,
    "limits.zip_max_ratio": 1000,
    "gc.max_size": None,
    "gc.min_free": None,
    "gc.grace": 3600.0,
    "gc.interval": 600.0,
    "gc.forget_unrecoverable": False,
    "cache.size": 0,
    "peers.urls": (),
    "peers.token": "",
    "peers.token_file": None,
    "peers.timeout": 2.0,
    "peers.down_for": 30.0,
    "peers.wait": 10.0,
    "peers.tls_cert": None,
    "peers.tls_key": None,
    "peers.ca_file": None,
    "runners.devices": ("cpu",),
    "runners.builtin": True,
    "runners.ready_timeout": 120.0,
    "runners.request_timeout": 60.0,
    "runners.stop_grace": 10.0,
    "runners.max_restarts": 5,
    "runners.restart_backoff": 0.5,
    "runners.max_inflight": 64,
    "runners.restart_wait": 30.0,
    "runners.max_response_size": None,
    "runners.selftest_on_load": True,
    "runners.selftest_rtol": 1e-5,
    "runners.selftest_atol": 1e-8,
    "runners.selftest_rtol_cuda": 1e-3,
    "runners.selftest_atol_cuda": 1e-5,
    "runners.commands": {},
    "runners.sandbox": "auto",
    "runners.user": "cartonstore-runner",
    "runners.memory_limit": None,
    "runners.max_processes": 512,
    "runners.sandbox_paths": (),
    "runners.prewarm": (),
    "runners.keep_alive": None,
    "runners.max_loaded": 0,
    "runners.max_memory": None,
    "runners.load_on_demand": False,
    "runners.load_wait": 60.0,
    "runners.pressure_psi": 0.0,
    "runners.pressure_cgroups": False,
    "runners.network": frozenset(),
    "mirror.listen": "",
    "mirror.upstream": "",
    "mirror.tag_ttl": 30.0,
}


# Settings written as TOML tables ([runners.<name>]), tested in test_runner_settings.py.
TABLES = {"runners.commands", "registries.mirrors"}


def test_the_defaults_table_covers_every_setting() -> None:
    assert list(DEFAULTS) == list(setting_keys())


@pytest.mark.parametrize("key", [key for key in DEFAULTS if key != "store.root"])
def test_default(key: str) -> None:
    assert get(load_config(env={}), key) == DEFAULTS[key]
    assert get(Config(), key) == DEFAULTS[key]


def test_default_root_and_socket(clean_env: Path) -> None:
    config = load_config(env={})
    assert config.store.root == clean_env / ".cache" / "cartonstore"
    assert config.socket_path == clean_env / ".cache" / "cartonstore" / "cartonstore.sock"
    assert config.source is None
    assert config == Config()


def test_default_root_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert load_config(env={}).store.root == tmp_path / "xdg" / "cartonstore"


def test_process_environment_is_the_default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARTONSTORE_LOG_LEVEL", "error")
    assert load_config().server.log_level == "error"


def test_settings_are_frozen() -> None:
    config = load_config(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.listen = "127.0.0.1:1"  # type: ignore[misc]  # a frozen field, written on purpose
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gc = None  # type: ignore[misc]  # a frozen field, written on purpose


# -- values from a file -------------------------------------------------------------------

FILE_VALUES = [
    ("store.root", '"/srv/models"', Path("/srv/models")),
    ("server.socket", '"/run/cs/api.sock"', Path("/run/cs/api.sock")),
    ("server.socket_mode", '"0600"', 0o600),
    ("server.socket_mode", '"660"', 0o660),
    ("server.socket_mode", '"0o640"', 0o640),
    ("server.socket_group", '"models"', "models"),
    ("server.socket_group", '"1234"', "1234"),
    ("server.listen", '"127.0.0.1:8000"', "127.0.0.1:8000"),
    ("server.listen", '"[::1]:0"', "[::1]:0"),
    ("server.listen", '"localhost:65535"', "localhost:65535"),
    ("server.allow_remote_listen", "true", True),
    ("server.grpc", "false", False),
    ("server.grpc_socket", '"/run/cs/g.sock"', Path("/run/cs/g.sock")),
    ("server.grpc_listen", '"127.0.0.1:8001"', "127.0.0.1:8001"),
    ("server.restore_loaded", "false", False),
    ("server.id", '"node-7.example.com/a"', "node-7.example.com/a"),
    ("server.log_format", '"json"', "json"),
    ("server.log_format", '"JSON"', "json"),
    ("server.log_level", '"debug"', "debug"),
    ("server.log_level", '"warning"', "warning"),
    ("server.log_level", '"error"', "error"),
    ("server.access_log", "true", True),
    ("server.shared_memory_over_tcp", "true", True),
    ("server.allow_tcp_local_sources", "true", True),
    ("server.arena_size", '"256MiB"', 256 * MiB),
    ("server.arena_size", "0", 0),
    ("server.check_workers", "0", 0),
    ("server.check_workers", "12", 12),
    ("server.check_workers", '"auto"', None),
    ("server.max_request_size", '"1GiB"', GiB),
    ("server.max_buffered", '"256MiB"', 256 * MiB),
    ("server.max_connections", "100", 100),
    ("server.max_connections_per_peer", "8", 8),
    ("server.head_timeout", '"2s"', 2.0),
    ("server.idle_timeout", '"5m"', 300.0),
    ("server.max_request_size", "1048576", MiB),
    ("server.shutdown_timeout", '"1m30s"', 90.0),
    ("server.shutdown_timeout", "5", 5.0),
    ("server.shutdown_timeout", "2.5", 2.5),
    ("server.shutdown_timeout", '"0"', 0.0),
    ("leases.default_ttl", '"30s"', 30.0),
    ("leases.max_ttl", '"2h"', 7200.0),
    ("leases.pin_ttl", '"5m"', 300.0),
    ("fetch.accept_encoding", '"gzip"', "gzip"),
    ("fetch.accept_encoding", '"zstd, identity;q=0.5"', "zstd, identity;q=0.5"),
    ("fetch.accept_encoding", '""', DEFAULT_ACCEPT_ENCODING),
    ("fetch.connect_timeout", '"500ms"', 0.5),
    ("fetch.stall_timeout", '"2m"', 120.0),
    ("fetch.retries", "0", 0),
    ("fetch.retries", '"7"', 7),
    ("fetch.backoff_base", '"0s"', 0.0),
    ("fetch.backoff_max", '"1m"', 60.0),
    ("fetch.max_concurrency", "32", 32),
    ("fetch.parallel_threshold", '"1G"', GiB),
    ("fetch.parallel_parts", "1", 1),
    ("fetch.coalesce_gap", "0", 0),
    ("fetch.lock_timeout", '"2h"', 7200.0),
    ("fetch.max_blob_size", '"100GB"', 100 * 10**9),
    ("fetch.max_blob_size", '""', None),
    ("fetch.mirrors", '["https://mirror.example.com/blobs", "http://10.0.0.5:8080/b/"]',
     ("https://mirror.example.com/blobs", "http://10.0.0.5:8080/b/")),
    ("fetch.allow_hosts", '["*.example.com", "10.0.0.0/8"]', ("*.example.com", "10.0.0.0/8")),
    ("fetch.deny_hosts", '["169.254.169.254", "::1"]', ("169.254.169.254", "::1")),
    ("fetch.max_redirects", "0", 0),
    ("fetch.allow_private_links", "true", True),
    ("registries.insecure", '["registry.lab:5000", "10.0.0.5"]', ("registry.lab:5000", "10.0.0.5")),
    ("registries.ca_file", '"/etc/cartonstore/ca.pem"', Path("/etc/cartonstore/ca.pem")),
    ("registries.auth_file", '"/etc/cartonstore/auth.json"', Path("/etc/cartonstore/auth.json")),
    ("registries.chunk_size", '"16MiB"', 16 << 20),
    ("registries.proxy", '"http://proxy.lab:3128"', "http://proxy.lab:3128"),
    ("registries.proxy", '""', None),
    ("registries.mirror_down_for", '"5m"', 300.0),
    ("registries.mirror_down_for", "0", 0.0),
    ("fetch.proxy", '"http://user:pw@10.0.0.9:3128"', "http://user:pw@10.0.0.9:3128"),
    ("fetch.no_proxy", '["*"]', ("*",)),
    ("fetch.no_proxy", '[".internal", "models.lab", "10.0.0.0/8", "::1", "*.corp"]',
     (".internal", "models.lab", "10.0.0.0/8", "::1", "*.corp")),
    ("server.tls_cert", '"/etc/cartonstore/node.pem"', Path("/etc/cartonstore/node.pem")),
    ("server.tls_key", '"/etc/cartonstore/node.key"', Path("/etc/cartonstore/node.key")),
    ("server.tls_client_ca", '"/etc/cartonstore/fleet-ca.pem"', Path("/etc/cartonstore/fleet-ca.pem")),
    ("server.token", '"api-s3cret"', "api-s3cret"),
    ("server.token_file", '"/etc/cartonstore/api-token"', Path("/etc/cartonstore/api-token")),
    ("hf.endpoint", '"https://hub.lab/hf/"', "https://hub.lab/hf"),
    ("hf.token", '"hf_abc"', "hf_abc"),
    ("hf.token_file", '"/etc/cs/hf-token"', Path("/etc/cs/hf-token")),
    ("peers.urls", '["http://10.0.0.2:7070", "https://node3:7070/"]', ("http://10.0.0.2:7070", "https://node3:7070/")),
    ("peers.token", '"s3cret-token"', "s3cret-token"),
    ("mirror.listen", '"127.0.0.1:5050"', "127.0.0.1:5050"),
    ("mirror.upstream", '"registry.example:5000"', "registry.example:5000"),
    ("mirror.tag_ttl", '"2m"', 120.0),
    ("peers.token_file", '"/etc/cartonstore/peer-token"', Path("/etc/cartonstore/peer-token")),
    ("peers.timeout", '"500ms"', 0.5),
    ("peers.down_for", '"1m"', 60.0),
    ("peers.wait", "0", 0.0),
    ("peers.tls_cert", '"/etc/cartonstore/node.pem"', Path("/etc/cartonstore/node.pem")),
    ("peers.tls_key", '"/etc/cartonstore/node.key"', Path("/etc/cartonstore/node.key")),
    ("peers.ca_file", '"/etc/cartonstore/fleet-ca.pem"', Path("/etc/cartonstore/fleet-ca.pem")),
    ("limits.zip_max_entries", "10", 10),
    ("limits.zip_max_ratio", "50", 50),
    ("gc.max_size", '"500GiB"', 500 * GiB),
    ("gc.max_size", "0", 0),
    ("gc.min_free", '"20G"', 20 * GiB),
    ("gc.grace", '"0"', 0.0),
    ("gc.interval", '"30s"', 30.0),
    ("gc.forget_unrecoverable", "true", True),
    ("cache.size", '"64MiB"', 64 << 20),
    ("runners.devices", '["cuda:0", "cuda:1"]', ("cuda:0", "cuda:1")),
    ("runners.devices", '"cpu,cuda:3"', ("cpu", "cuda:3")),
    ("runners.builtin", "false", False),
    ("runners.ready_timeout", '"5m"', 300.0),
    ("runners.request_timeout", "2.5", 2.5),
    ("runners.stop_grace", "0", 0.0),
    ("runners.max_restarts", "0", 0),
    ("runners.restart_backoff", '"100ms"', 0.1),
    ("runners.max_inflight", "1", 1),
    ("runners.restart_wait", '"0"', 0.0),
    ("runners.max_response_size", '"32MiB"', 32 << 20),
    ("runners.selftest_on_load", "false", False),
    ("runners.selftest_rtol", "0.001", 0.001),
    ("runners.selftest_atol", '"1e-6"', 1e-6),
    ("runners.selftest_rtol_cuda", "0.01", 0.01),
    ("runners.selftest_atol_cuda", "0", 0.0),
    ("runners.sandbox", '"landlock"', "landlock"),
    ("runners.user", '"65534"', "65534"),
    ("runners.memory_limit", '"2GiB"', 2 << 30),
    ("runners.max_processes", "64", 64),
    ("runners.sandbox_paths", '["/opt/models"]', ("/opt/models",)),
    ("runners.prewarm", '["onnx", "torchscript", "onnx"]', ("onnx", "torchscript")),
    ("runners.keep_alive", '"-1m"', math.inf),
    ("runners.max_loaded", "3", 3),
    ("runners.max_memory", '"160MiB"', 160 << 20),
    ("runners.load_on_demand", "true", True),
    ("runners.load_wait", '"90s"', 90.0),
    ("runners.pressure_psi", "12.5", 12.5),
    ("runners.pressure_cgroups", "true", True),
    ("runners.network", '{ allow = ["fetcher"] }', frozenset({"fetcher"})),
]


def test_the_file_values_table_covers_every_setting() -> None:
    assert {key for key, _, _ in FILE_VALUES} == set(setting_keys()) - TABLES


@pytest.mark.parametrize(("key", "literal", "expected"), FILE_VALUES,
                         ids=[f"{key}={literal}" for key, literal, _ in FILE_VALUES])
def test_file_value(tmp_path: Path, key: str, literal: str, expected: object) -> None:
    path = write_setting(tmp_path, key, literal)
    config = load_config(path, env={})
    assert get(config, key) == expected
    assert config.source == path
    others = load_config(env={})
    for other in setting_keys():
        if other != key:
            assert get(config, other) == get(others, other), other


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), env={}) == load_config(env={})


def test_empty_root_means_the_default(tmp_path: Path, clean_env: Path) -> None:
    config = load_config(write(tmp_path, '[store]\nroot = ""\n'), env={})
    assert config.store.root == clean_env / ".cache" / "cartonstore"


def test_relative_paths_in_a_file_are_relative_to_its_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    path = write(tmp_path / "etc", '[store]\nroot = "data"\n[server]\nsocket = "../run/cs.sock"\n')
    config = load_config(path, env={})
    assert config.store.root == tmp_path / "etc" / "data"
    assert config.socket_path == tmp_path / "etc" / ".." / "run" / "cs.sock"


def test_tilde_is_expanded(tmp_path: Path, clean_env: Path) -> None:
    config = load_config(write(tmp_path, '[store]\nroot = "~/models"\n'), env={})
    assert config.store.root == clean_env / "models"
    assert config.socket_path == clean_env / "models" / "cartonstore.sock"


def test_socket_path_prefers_the_socket_setting(tmp_path: Path) -> None:
    config = load_config(env={"CARTONSTORE_ROOT": "/srv/a", "CARTONSTORE_SOCKET": "/run/b.sock"})
    assert config.socket_path == Path("/run/b.sock")
    assert load_config(env={"CARTONSTORE_ROOT": "/srv/a"}).socket_path == Path("/srv/a/cartonstore.sock")


# -- the environment and overrides ------------------------------------------------------

ENV_VALUES = [
    ("CARTONSTORE_ROOT", "/srv/a", "store.root", Path("/srv/a")),
    ("CARTONSTORE_SOCKET", "/run/a.sock", "server.socket", Path("/run/a.sock")),
    ("CARTONSTORE_LISTEN", "127.0.0.1:9", "server.listen", "127.0.0.1:9"),
    ("CARTONSTORE_GRPC_LISTEN", "127.0.0.1:8", "server.grpc_listen", "127.0.0.1:8"),
    ("CARTONSTORE_ID", "node-7/a", "server.id", "node-7/a"),
    ("CARTONSTORE_LOG_FORMAT", "json", "server.log_format", "json"),
    ("CARTONSTORE_LOG_LEVEL", "DEBUG", "server.log_level", "debug"),
    ("CARTONSTORE_ACCESS_LOG", "true", "server.access_log", True),
    ("CARTONSTORE_SANDBOX", "bwrap", "runners.sandbox", "bwrap"),
    ("CARTONSTORE_ALLOW_PRIVATE_LINKS", "true", "fetch.allow_private_links", True),
    ("HF_ENDPOINT", "http://127.0.0.1:9/", "hf.endpoint", "http://127.0.0.1:9"),
    ("HF_TOKEN", "hf_abc", "hf.token", "hf_abc"),
]


def test_the_env_table_covers_every_variable() -> None:
    assert {(var, key) for var, _, key, _ in ENV_VALUES} == set(ENV_VARS.items())


@pytest.mark.parametrize(("var", "value", "key", "expected"), ENV_VALUES,
                         ids=[var for var, *_ in ENV_VALUES])
def test_env_value(var: str, value: str, key: str, expected: object) -> None:
    assert get(load_config(env={var: value}), key) == expected
    # an empty variable is as good as unset
    assert get(load_config(env={var: ""}), key) == get(load_config(env={}), key)


def test_relative_env_paths_are_relative_to_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(env={"CARTONSTORE_ROOT": "store"}, overrides={"server.socket": "s.sock"})
    assert config.store.root == tmp_path / "store"
    assert config.server.socket == tmp_path / "s.sock"


OVERRIDES = [
    ("store.root", Path("/srv/o"), Path("/srv/o")),
    ("server.listen", "[::1]:8000", "[::1]:8000"),
    ("server.allow_remote_listen", "yes", True),
    ("server.allow_remote_listen", "off", False),
    ("server.max_request_size", 1024, KiB),
    ("server.socket_mode", "0600", 0o600),
    ("gc.max_size", "10G", 10 * GiB),
    ("gc.max_size", "", None),
    ("gc.grace", 30, 30.0),
    ("gc.grace", "2d", 172800.0),
    ("fetch.retries", "3", 3),
    ("fetch.mirrors", ["https://m.example.com"], ("https://m.example.com",)),
]


@pytest.mark.parametrize(("key", "value", "expected"), OVERRIDES,
                         ids=[f"{key}={value!r}" for key, value, _ in OVERRIDES])
def test_override_value(key: str, value: object, expected: object) -> None:
    assert get(load_config(env={}, overrides={key: value}), key) == expected


def test_none_overrides_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nlisten = "127.0.0.1:1"\n')
    config = load_config(path, env={}, overrides={"server.listen": None, "gc.max_size": None})
    assert config.server.listen == "127.0.0.1:1"
    assert config.gc.max_size is None


def test_empty_root_override_restores_the_default(tmp_path: Path, clean_env: Path) -> None:
    config = load_config(env={"CARTONSTORE_ROOT": "/srv/a"}, overrides={"store.root": ""})
    assert config.store.root == clean_env / ".cache" / "cartonstore"


PRECEDENCE_KEYS = [
    # key, file literal, env var and value, override, expected for (file, env, override)
    ("server.listen", '"127.0.0.1:1"', ("CARTONSTORE_LISTEN", "127.0.0.1:2"), "127.0.0.1:3",
     ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "")),
    ("server.log_level", '"warning"', ("CARTONSTORE_LOG_LEVEL", "error"), "debug",
     ("warning", "error", "debug", "info")),
    ("server.log_format", '"json"', ("CARTONSTORE_LOG_FORMAT", "text"), "json",
     ("json", "text", "json", "text")),
    ("store.root", '"/srv/file"', ("CARTONSTORE_ROOT", "/srv/env"), "/srv/cli",
     (Path("/srv/file"), Path("/srv/env"), Path("/srv/cli"), None)),
    ("server.socket", '"/run/file.sock"', ("CARTONSTORE_SOCKET", "/run/env.sock"), "/run/cli.sock",
     (Path("/run/file.sock"), Path("/run/env.sock"), Path("/run/cli.sock"), None)),
]


@pytest.mark.parametrize("layers", list(itertools.product([False, True], repeat=3)),
                         ids=lambda layers: "+".join(name for name, on in
                                                     zip(("file", "env", "cli"), layers, strict=True) if on) or "none")
@pytest.mark.parametrize("case", PRECEDENCE_KEYS, ids=[case[0] for case in PRECEDENCE_KEYS])
def test_precedence_overrides_env_file_defaults(tmp_path: Path, case: tuple,
                                                layers: tuple[bool, bool, bool]) -> None:
    key, literal, (var, env_value), override, expected = case
    use_file, use_env, use_override = layers
    path = write_setting(tmp_path, key, literal) if use_file else None
    config = load_config(path, env={var: env_value} if use_env else {},
                         overrides={key: override} if use_override else None)
    winner = 2 if use_override else 1 if use_env else 0 if use_file else 3
    want = expected[winner]
    if want is None:  # the computed default
        want = get(load_config(env={}), key)
    assert get(config, key) == want


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, '[gc]\ninterval = "1m"\n')
    config = load_config(env={CONFIG_ENV: str(path)})
    assert config.gc.interval == 60.0
    assert config.source == path


def test_an_explicit_path_beats_the_environment(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write(tmp_path / "a", '[gc]\ninterval = "1m"\n')
    b = write(tmp_path / "b", '[gc]\ninterval = "2m"\n')
    assert load_config(b, env={CONFIG_ENV: str(a)}).gc.interval == 120.0


# -- bad values ---------------------------------------------------------------------------

BAD_VALUES = [
    ("store.root", "5", "expected a path"),
    ("server.socket", '["a"]', "expected a path"),
    ("server.socket_mode", '"rw-rw----"', "octal string"),
    ("server.socket_mode", '"0888"', "octal string"),
    ("server.socket_mode", '"01777"', "octal string"),
    ("server.socket_mode", "432", "octal string"),
    ("server.socket_group", '"bad group"', "group name"),
    ("server.listen", '"8000"', "expected HOST:PORT"),
    ("server.grpc_listen", '"8001"', "expected HOST:PORT"),
    ("mirror.listen", '"5050"', "expected HOST:PORT"),
    ("mirror.upstream", '"https://registry.example/"', "expected a registry's HOST[:PORT]"),
    ("mirror.tag_ttl", '"soon"', "expected a duration such as 90"),
    ("server.grpc", '"yes please"', "expected true or false"),
    ("server.restore_loaded", "1", "expected true or false"),
    ("server.id", '"two words"', "expected an identity"),
    ("server.grpc_socket", "5", "expected a path"),
    ("server.listen", '"127.0.0.1:70000"', "expected HOST:PORT"),
    ("server.listen", '"::1:80"', "expected HOST:PORT"),
    ("server.listen", '"[fe80::zz]:80"', "expected HOST:PORT"),
    ("server.listen", '":80"', "expected HOST:PORT"),
    ("server.listen", "8000", "expected HOST:PORT as a string"),
    ("server.listen", '"0.0.0.0:8000"', "is not a loopback address"),
    ("server.allow_remote_listen", '"maybe"', "expected true or false, got 'maybe'"),
    ("server.access_log", '"sometimes"', "expected true or false, got 'sometimes'"),
    ("server.shared_memory_over_tcp", "1", "expected true or false"),
    ("server.allow_tcp_local_sources", "1", "expected true or false"),
    ("server.arena_size", "-1", "expected a size >= 0, got -1"),
    ("server.check_workers", "-1", "expected an integer >= 0, got -1"),
    ("server.check_workers", '"many"', "expected an integer >= 0, got 'many'"),
    ("server.log_format", '"xml"', "expected one of 'text', 'json', got 'xml'"),
    ("server.log_level", '"verbose"', "expected one of 'debug', 'info', 'warning', 'error'"),
    ("server.max_request_size", '"lots"', "expected a size such as 512MiB"),
    ("server.max_buffered", "0", "expected a size >= 1, got 0"),
    ("server.max_connections", "0", "expected an integer >= 1, got 0"),
    ("server.max_connections_per_peer", '"many"', "expected an integer >= 1"),
    ("server.head_timeout", "0", "expected a duration > 0"),
    ("server.idle_timeout", '"never"', "expected a duration such as 90"),
    ("server.max_request_size", "0", "expected a size >= 1, got 0"),
    ("server.max_request_size", "-5", "expected a size >= 1, got -5"),
    ("server.max_request_size", "1.5", "expected a size"),
    ("server.shutdown_timeout", '"soon"', "expected a duration such as 90"),
    ("server.shutdown_timeout", "-1", "expected a duration >= 0, got -1"),
    ("leases.default_ttl", '"0s"', "expected a duration > 0, got '0s'"),
    ("leases.default_ttl", '"2h"', "leases.default_ttl (2h) must not exceed leases.max_ttl (1h)"),
    ("leases.max_ttl", "true", "expected a duration such as 90"),
    ("leases.max_ttl", '"30s"', "leases.default_ttl (1m) must not exceed leases.max_ttl (30s)"),
    ("leases.pin_ttl", '"-5s"', "expected a duration"),
    ("fetch.accept_encoding", '"lz4"', "coding 'lz4' cannot be decoded"),
    ("fetch.accept_encoding", '"gzip,,br"', "coding '' cannot be decoded"),
    ("fetch.accept_encoding", "7", "as a string"),
    ("fetch.connect_timeout", "0", "expected a duration > 0, got 0"),
    ("fetch.stall_timeout", '"forever"', "expected a duration"),
    ("fetch.retries", '"many"', "expected an integer >= 0, got 'many'"),
    ("fetch.retries", "-1", "expected an integer >= 0, got -1"),
    ("fetch.retries", "1.5", "expected an integer >= 0, got 1.5"),
    ("fetch.retries", "true", "expected an integer >= 0, got True"),
    ("fetch.backoff_base", '"1h"', "fetch.backoff_base (1h) must not exceed fetch.backoff_max (30s)"),
    ("fetch.backoff_max", '"x"', "expected a duration"),
    ("fetch.backoff_max", '"0.1s"', "must not exceed fetch.backoff_max (0.1s)"),
    ("fetch.max_concurrency", "0", "expected an integer >= 1, got 0"),
    ("fetch.parallel_threshold", "0", "expected a size >= 1"),
    ("fetch.parallel_parts", "0", "expected an integer >= 1"),
    ("fetch.coalesce_gap", "-1", "expected a size >= 0"),
    ("fetch.lock_timeout", "0", "expected a duration > 0"),
    ("fetch.max_blob_size", "0", 'expected a size >= 1 (or "" for no limit)'),
    ("fetch.max_blob_size", '"big"', "expected a size"),
    ("fetch.mirrors", '"https://m.example.com"', "expected a list of strings"),
    ("fetch.mirrors", "[1]", "expected a list of strings"),
    ("fetch.mirrors", '["ftp://m.example.com"]', "scheme 'ftp' is not allowed"),
    ("fetch.mirrors", '["m.example.com/blobs"]', "no scheme"),
    ("fetch.mirrors", '["https://m.example.com/b?sig=1"]', "cannot have a query"),
    ("fetch.allow_hosts", '["bad host"]', "bad host pattern 'bad host'"),
    ("fetch.deny_hosts", '"10.0.0.0/8"', "expected a list of strings"),
    ("fetch.max_redirects", "-1", "expected an integer >= 0"),
    ("fetch.allow_private_links", '"maybe"', "expected true or false"),
    ("registries.insecure", '["https://registry.lab"]', "is not a registry host or host:port"),
    ("registries.ca_file", "5", "expected a path"),
    ("registries.auth_file", "[]", "expected a path"),
    ("registries.chunk_size", '"1KiB"', "expected a size"),
    ("registries.proxy", '"https://proxy.lab:3128"', "a proxy is http://HOST:PORT"),
    ("registries.mirror_down_for", '"a while"', "expected a duration"),
    ("fetch.proxy", '"socks5://10.0.0.9:1080"', "a proxy is http://HOST:PORT"),
    ("fetch.proxy", '"http://proxy.lab:3128/path"', "no path or query"),
    ("fetch.proxy", "3128", "expected a proxy URL"),
    ("fetch.no_proxy", '["models.lab:8080"]', "'models.lab:8080' is not a host, .domain, IP address or CIDR"),
    ("fetch.no_proxy", '"*"', "expected a list of strings"),
    ("server.tls_cert", "5", "expected a path"),
    ("server.tls_key", "[]", "expected a path"),
    ("server.tls_client_ca", "true", "expected a path"),
    ("peers.urls", '["node2/x"]', "no scheme"),
    ("peers.urls", '["http://10.0.0.2:7070/v1/blobs"]', "cannot have a path, query or fragment"),
    ("peers.token", '"two words"', "without spaces"),
    ("hf.endpoint", '"ftp://hub.lab"', "scheme 'ftp' is not allowed"),
    ("hf.token", '"two words"', "without spaces"),
    ("hf.token_file", "1", "expected a path"),
    ("server.token", '"two words"', "without spaces"),
    ("server.token_file", "1", "expected a path"),
    ("peers.token", '"caf\u00e9"', "printable ASCII"),
    ("peers.token_file", "1", "expected a path"),
    ("peers.timeout", "0", "expected a duration > 0"),
    ("peers.down_for", '"a while"', "expected a duration"),
    ("peers.wait", "-1", "expected a duration"),
    ("peers.tls_cert", "[]", "expected a path"),
    ("peers.tls_key", "1", "expected a path"),
    ("peers.ca_file", "false", "expected a path"),
    ("limits.zip_max_entries", "0", "expected an integer >= 1"),
    ("limits.zip_max_ratio", '"high"', "expected an integer >= 1, got 'high'"),
    ("gc.max_size", '"-1G"', "expected a size"),
    ("gc.min_free", "[]", "expected a size"),
    ("gc.grace", '"1 hour"', "expected a duration"),
    ("gc.interval", "0", "expected a duration > 0"),
    ("gc.forget_unrecoverable", '"sometimes"', "expected true or false, got 'sometimes'"),
    ("cache.size", "-1", "expected a size"),
    ("runners.devices", '["gpu0"]', "unknown device 'gpu0'"),
    ("runners.devices", "[]", "expected a list of devices"),
    ("runners.builtin", '"maybe"', "expected true or false"),
    ("runners.ready_timeout", "0", "expected a duration > 0"),
    ("runners.request_timeout", '"soon"', "duration"),
    ("runners.stop_grace", "-1", "expected a duration"),
    ("runners.max_restarts", "-1", "expected an integer >= 0"),
    ("runners.restart_backoff", "true", "expected a duration"),
    ("runners.max_inflight", "0", "expected an integer >= 1"),
    ("runners.restart_wait", '"-2s"', "expected a duration"),
    ("runners.max_response_size", "0", 'expected a size >= 1 (or "" for no limit)'),
    ("runners.selftest_on_load", '"maybe"', "expected true or false"),
    ("runners.selftest_rtol", "-1", "expected a number >= 0"),
    ("runners.selftest_rtol_cuda", '"lots"', "expected a number >= 0"),
    ("runners.selftest_atol_cuda", "-0.5", "expected a number >= 0"),
    ("runners.selftest_atol", '"nan"', "expected a number >= 0"),
    ("runners.sandbox", '"docker"', "expected one of"),
    ("runners.user", '"two words"', "expected a user name"),
    ("runners.memory_limit", '"lots"', "size"),
    ("runners.max_processes", "-1", "integer"),
    ("runners.sandbox_paths", '["relative/path"]', "absolute paths"),
    ("runners.prewarm", '["tensorflow"]', "only python, onnx, torchscript can be pre-warmed"),
    ("runners.keep_alive", '"soon"', "expected a keep_alive such as 5m, 30s, 0 (unload once answered) or -1"),
    ("runners.max_loaded", "-1", "expected an integer >= 0"),
    ("runners.max_memory", '"1KiB"', "expected a size >= 1048576"),
    ("runners.load_on_demand", '"perhaps"', "expected true or false"),
    ("runners.load_wait", '"0s"', "expected a duration > 0"),
    ("runners.pressure_psi", "101", "expected a percentage in [0, 100]"),
    ("runners.pressure_cgroups", '"perhaps"', "expected true or false"),
    ("runners.network", '{ deny = ["x"] }', "[runners.network]"),
]


def test_the_bad_values_table_covers_every_setting() -> None:
    assert {key for key, _, _ in BAD_VALUES} == set(setting_keys()) - TABLES


@pytest.mark.parametrize(("key", "literal", "fragment"), BAD_VALUES,
                         ids=[f"{key}={literal}" for key, literal, _ in BAD_VALUES])
def test_bad_file_value_names_the_file_and_key(tmp_path: Path, key: str, literal: str,
                                               fragment: str) -> None:
    path = write_setting(tmp_path, key, literal)
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"config {path}: {key}: ")
    assert fragment in str(caught.value)
    assert caught.value.subject == key


def test_the_message_reads_as_documented(tmp_path: Path) -> None:
    path = write(tmp_path, '[fetch]\nretries = "many"\n')
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={})
    assert str(caught.value) == f"config {path}: fetch.retries: expected an integer >= 0, got 'many'"


@pytest.mark.parametrize(("var", "value", "fragment"), [
    ("CARTONSTORE_LISTEN", "nonsense", "server.listen: expected HOST:PORT"),
    ("CARTONSTORE_LISTEN", "0.0.0.0:80", "server.listen: '0.0.0.0:80' is not a loopback address"),
    ("CARTONSTORE_LOG_FORMAT", "xml", "server.log_format: expected one of"),
    ("CARTONSTORE_LOG_LEVEL", "loud", "server.log_level: expected one of"),
    ("CARTONSTORE_ROOT", "a\0b", "store.root: expected a path"),
    ("CARTONSTORE_SOCKET", "a\0b", "server.socket: expected a path"),
])
def test_bad_env_value_names_the_variable(var: str, value: str, fragment: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        load_config(env={var: value})
    assert str(caught.value).startswith(f"environment {var}: ")
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"fetch.retries": "many"}, "command line: fetch.retries: expected an integer >= 0, got 'many'"),
    ({"gc.max_size": "huge"}, "command line: gc.max_size: expected a size"),
    ({"gc.grace": True}, "command line: gc.grace: expected a duration"),
    ({"server.socket_mode": 0o660}, "command line: server.socket_mode: expected permission bits"),
    ({"server.lisen": "127.0.0.1:1"},
     "command line: unknown key 'server.lisen'; did you mean 'server.listen'?"),
    ({"listen": "127.0.0.1:1"}, "command line: unknown key 'listen'; did you mean 'server.listen'?"),
])
def test_bad_override_says_command_line(overrides: dict, fragment: str) -> None:
    with pytest.raises(InvalidInput, match="^command line: ") as caught:
        load_config(env={}, overrides=overrides)
    assert str(caught.value) == fragment or str(caught.value).startswith(fragment)


def test_a_bad_lower_layer_is_reported_even_when_overridden(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nlog_level = "verbose"\n')
    with pytest.raises(InvalidInput, match=f"^config {path}: server.log_level: "):
        load_config(path, env={"CARTONSTORE_LOG_LEVEL": "debug"}, overrides={"server.log_level": "info"})


def test_conflict_names_the_layer_that_set_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[leases]\ndefault_ttl = "10m"\n')
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={}, overrides={"leases.max_ttl": "5m"})
    assert str(caught.value) == ("command line: leases.max_ttl: leases.default_ttl (10m) must "
                                 "not exceed leases.max_ttl (5m)")


# -- the loopback rule for server.listen ---------------------------------------------------

LOOPBACK = ["127.0.0.1:80", "127.1.2.3:0", "[::1]:8000", "localhost:1", "LOCALHOST:1",
            "[::ffff:127.0.0.1]:80"]
REMOTE = ["0.0.0.0:80", "[::]:80", "10.1.2.3:80", "example.com:80", "[::ffff:10.0.0.1]:80",
          "localhost.example.com:80"]


@pytest.mark.parametrize("listen", LOOPBACK)
def test_loopback_listen_is_allowed(listen: str) -> None:
    config = load_config(env={}, overrides={"server.listen": listen})
    host, port = config.server.listen_address
    assert listen.startswith(f"[{host}]:" if ":" in host else f"{host}:")
    assert str(port) == listen.rpartition(":")[2]


@pytest.mark.parametrize("listen", REMOTE)
def test_remote_listen_needs_allow_remote_listen(tmp_path: Path, listen: str) -> None:
    path = write(tmp_path, f'[server]\nlisten = "{listen}"\n')
    with pytest.raises(InvalidInput, match="allow_remote_listen = true") as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"config {path}: server.listen: ")
    with pytest.raises(InvalidInput, match="no credential is configured: set server.token"):
        load_config(path, env={}, overrides={"server.allow_remote_listen": "true"})
    allowed = load_config(path, env={}, overrides={"server.allow_remote_listen": "true", "server.token": "t0ken"})
    assert allowed.server.listen == listen


def test_listen_address() -> None:
    assert load_config(env={}).server.listen_address is None
    config = load_config(env={"CARTONSTORE_LISTEN": "[0:0::1]:8080"})
    assert config.server.listen_address == ("0:0::1", 8080)


def test_socket_gid(tmp_path: Path) -> None:
    import grp
    import os

    assert load_config(env={}).server.socket_gid() is None
    assert load_config(env={}, overrides={"server.socket_group": "4321"}).server.socket_gid() == 4321
    try:
        name = grp.getgrgid(os.getgid()).gr_name
    except KeyError:  # a container's gid may have no name
        name = None
    if name is not None:
        config = load_config(env={}, overrides={"server.socket_group": name})
        assert config.server.socket_gid() == os.getgid()
    missing = load_config(env={}, overrides={"server.socket_group": "no-such-group-xyz"})
    with pytest.raises(InvalidInput, match="server.socket_group: no group named 'no-such-group-xyz'"):
        missing.server.socket_gid()


# -- mirrors and the URL policy --------------------------------------------------------------


@pytest.mark.parametrize(("text", "fragment"), [
    ('mirrors = ["https://m.example.com"]\ndeny_hosts = ["*.example.com"]', "is denied"),
    ('mirrors = ["https://m.example.com"]\nallow_hosts = ["other.org"]', "is not in allow_hosts"),
])
def test_a_mirror_the_policy_refuses_is_an_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, f"[fetch]\n{text}\n")
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert message.startswith(f"config {path}: fetch.mirrors: mirror https://m.example.com would never be used")
    assert fragment in message


@pytest.mark.parametrize("literal", [
    '["https://user:s3cret@m.example.com/b?sig=abc"]',
    '"https://user:s3cret@m.example.com/b?sig=abc"',
    '["ftp://user:s3cret@m.example.com/b?sig=abc"]',
])
def test_mirror_credentials_stay_out_of_messages(tmp_path: Path, literal: str) -> None:
    path = write_setting(tmp_path, "fetch.mirrors", literal)
    with pytest.raises(InvalidInput, match="fetch.mirrors: ") as caught:
        load_config(path, env={})
    assert "s3cret" not in str(caught.value)
    assert "sig=abc" not in str(caught.value)


# -- unknown keys and broken files ------------------------------------------------------------

UNKNOWN = [
    ("[server]\nlisen = 1\n", "unknown key 'server.lisen'; did you mean 'server.listen'?"),
    ("[sever]\nlisten = 1\n", "unknown section [sever]; did you mean 'server'?"),
    ("[lease]\nmax_ttl = 1\n", "unknown section [lease]; did you mean 'leases'?"),
    ("listen = '127.0.0.1:1'\n", "unknown key 'listen'; did you mean 'server.listen'?"),
    ("[fetch]\nlisten = 1\n", "unknown key 'fetch.listen'; did you mean 'server.listen'?"),
    ("[fetch]\nmirror = []\n", "unknown key 'fetch.mirror'; did you mean 'fetch.mirrors'?"),
    ("[gc]\nmaxsize = 1\n", "unknown key 'gc.maxsize'; did you mean 'gc.max_size'?"),
    ("[fetch]\nretry = 1\n", "unknown key 'fetch.retry'; did you mean 'fetch.retries'?"),
    ("[gc]\nzzzzzz = 1\n", "unknown key 'gc.zzzzzz'"),
    ("[fetch.zzzzzz]\nx = 1\n", "unknown key 'fetch.zzzzzz'"),
    ("[frobnicate]\nx = 1\n", "unknown section [frobnicate]"),
    ("server = 1\n", "server: expected a table ([server]), got 1"),
]


@pytest.mark.parametrize(("text", "message"), UNKNOWN, ids=[m for _, m in UNKNOWN])
def test_unknown_keys_are_errors_with_suggestions(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"config {path}: {message}")
    if "did you mean" not in message:
        assert "did you mean" not in str(caught.value)


@pytest.mark.parametrize(("text", "line"), [
    ("[server]\nlisten = \n", 2),
    ('[server]\nlisten = "a"\nlisten = "b"\n', 3),
    ("[gc]\n\n\ngrace = 1h\n", 4),
    ("[server\n", 1),
])
def test_invalid_toml_names_the_line(tmp_path: Path, text: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"config {path}: invalid TOML: ")
    assert f"line {line}" in str(caught.value)
    assert caught.value.subject == str(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(InvalidInput, match=f"^config {path}: cannot read: No such file"):
        load_config(path, env={})
    with pytest.raises(InvalidInput, match=f"^config {path}: cannot read"):
        load_config(env={CONFIG_ENV: str(path)})


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "cartonstore.toml"
    path.write_bytes(b'[server]\nlisten = "\xff"\n')
    with pytest.raises(InvalidInput, match="not UTF-8"):
        load_config(path, env={})


# -- the shipped config file -----------------------------------------------------------------


def test_shipped_config_is_exactly_the_defaults() -> None:
    config = load_config(SHIPPED, env={})
    assert config == load_config(env={})
    assert config.as_dict() == load_config(env={}).as_dict()


def test_shipped_config_lists_every_setting() -> None:
    data = tomli.loads(SHIPPED.read_text())
    listed = [f"{section}.{name}" for section, table in data.items() for name in table]
    assert listed == [key for key in setting_keys() if key not in TABLES]


def test_shipped_config_explains_every_setting() -> None:
    lines = SHIPPED.read_text().splitlines()
    for number, line in enumerate(lines):
        if line and not line.startswith(("#", "[")):
            previous = next(p for p in reversed(lines[:number]) if p.strip())
            assert previous.startswith("#"), f"line {number + 1} ({line!r}) has no comment above it"


# -- what the settings build ------------------------------------------------------------------


def test_fetch_settings_mirror_fetch_config() -> None:
    fetch_fields = {f.name for f in dataclasses.fields(FetchConfig)} - {"policy", "registries", "peers", "hub"}
    policy_fields = {f.name for f in dataclasses.fields(UrlPolicy)}
    assert {f.name for f in dataclasses.fields(FetchSettings)} == fetch_fields | policy_fields


def test_peer_settings_reach_fetch_config(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-the-file\n")
    path = write(tmp_path, '[peers]\nurls = ["http://10.0.0.2:7070/"]\ntoken = "inline"\ntoken_file = "token"\n'
                           'timeout = "1s"\n[fetch]\nproxy = "http://10.0.0.9:3128"\n')
    fetch = load_config(path, env={}).fetch_config()
    assert fetch.peers.urls == ("http://10.0.0.2:7070",) and fetch.peers.token == "from-the-file"
    assert fetch.peers.timeout == 1.0 and fetch.proxy == "http://10.0.0.9:3128" and fetch.registries.proxy is None
    (tmp_path / "token").write_text("two words")
    with pytest.raises(InvalidInput, match="peers.token_file .*token: expected one token without spaces"):
        load_config(path, env={}).fetch_config()
    (tmp_path / "token").unlink()
    with pytest.raises(InvalidInput, match="peers.token_file .*token: cannot read it"):
        load_config(path, env={}).fetch_config()


def test_a_peer_the_url_policy_refuses_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, '[peers]\nurls = ["http://10.0.0.2:7070"]\n[fetch]\ndeny_hosts = ["10.0.0.0/8"]\n')
    with pytest.raises(InvalidInput, match="peer http://10.0.0.2:7070 would never be used: host '10.0.0.2' is denied"):
        load_config(path, env={})


def test_registry_settings_reach_fetch_config(tmp_path: Path) -> None:
    path = write(tmp_path, '[registries]\ninsecure = ["Lab:5000"]\nca_file = "ca.pem"\nchunk_size = "8MiB"\n')
    registries = load_config(path, env={}).fetch_config().registries
    assert registries.insecure == ("lab:5000",) and registries.ca_file == tmp_path / "ca.pem"
    assert registries.chunk_size == 8 << 20 and registries.auth_file is None


def test_default_fetch_config_and_zip_limits() -> None:
    config = load_config(env={})
    assert config.fetch_config() == FetchConfig()
    assert config.zip_limits() == ZipLimits()


def test_fetch_config_carries_every_value(tmp_path: Path) -> None:
    path = write(tmp_path, """
[fetch]
accept_encoding = "gzip"
connect_timeout = "1s"
stall_timeout = "2s"
retries = 1
backoff_base = "3s"
backoff_max = "4s"
max_concurrency = 5
parallel_threshold = "6MiB"
parallel_parts = 7
coalesce_gap = "8KiB"
lock_timeout = "9s"
max_blob_size = "10GiB"
mirrors = ["https://m.example.com/b"]
allow_hosts = ["*.example.com"]
deny_hosts = ["bad.example.com"]
max_redirects = 11
[limits]
zip_max_entries = 12
zip_max_ratio = 13
""")
    config = load_config(path, env={})
    assert config.fetch_config() == FetchConfig(
        accept_encoding="gzip", connect_timeout=1.0, stall_timeout=2.0, retries=1,
        backoff_base=3.0, backoff_max=4.0, max_concurrency=5, parallel_threshold=6 * MiB,
        parallel_parts=7, coalesce_gap=8 * KiB, lock_timeout=9.0, max_blob_size=10 * GiB,
        mirrors=("https://m.example.com/b",),
        policy=UrlPolicy(allow_hosts=("*.example.com",), deny_hosts=("bad.example.com",),
                         max_redirects=11))
    assert config.zip_limits() == dataclasses.replace(ZipLimits(), max_entries=12, max_ratio=13)


@pytest.mark.parametrize("overrides", [
    {},
    {"server.listen": "[::1]:0", "server.socket_mode": "0600", "fetch.backoff_base": 0.25,
     "gc.grace": 90.5, "gc.max_size": 1234567, "gc.min_free": "3GB", "fetch.max_blob_size": "1T",
     "fetch.mirrors": ["https://m.example.com"], "leases.pin_ttl": "1d2h3m4s",
     "fetch.connect_timeout": 1e-7},
])
def test_as_dict_is_toml_that_loads_back(tmp_path: Path, overrides: dict) -> None:
    config = load_config(env={}, overrides=overrides)
    shown = config.as_dict()
    assert list(shown) == ["store", "server", "leases", "fetch", "registries", "hf", "limits", "gc", "cache",
                           "peers", "runners", "mirror"]
    # [runners.<name>] tables are shown flattened into [runners]; [registries.mirrors] stays one table
    assert [f"{s}.{k}" for s, table in shown.items() for k in table] == \
        [key for key in setting_keys() if key != "runners.commands"]
    path = write(tmp_path, tomli_w.dumps(shown))
    again = load_config(path, env={})
    assert again.as_dict() == shown
    assert again == dataclasses.replace(
        config, server=dataclasses.replace(config.server, socket=config.socket_path))


@pytest.mark.parametrize(("size", "text"), [
    (None, ""), (0, "0"), (1000, "1000"), (KiB, "1KiB"), (1536, "1536"),
    (256 * MiB, "256MiB"), (3 * GiB, "3GiB"), (1 << 40, "1TiB"), (10**9, "1000000000"),
])
def test_format_size(size: int | None, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0s"), (10.0, "10s"), (60.0, "1m"), (90.0, "1m30s"), (3600.0, "1h"),
    (93784.0, "1d2h3m4s"), (0.5, "0.5s"), (90.25, "90.25s"), (1e-7, "0.0000001s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


# -- systemd units -----------------------------------------------------------------------------


def read_unit(name: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as (key, value) lists: keys may repeat."""
    path = UNITS / name
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keys kept as written, configparser's own hook
    parser.read_string(path.read_text())  # must parse as INI
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None and "=" in line, f"{name}:{number}: not KEY=VALUE: {line!r}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [value for k, value in unit.get(section, []) if k == key]


def value(unit: dict, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}: {found}"
    return found[0]


def environment(unit: dict) -> dict[str, str]:
    pairs = [item.split("=", 1) for line in values(unit, "Service", "Environment")
             for item in shlex.split(line)]
    return dict(pairs)


# Both run as root (the daemon runs each runner as runners.user, so it must
# be able to change to it), in group cartonstore, with the rest locked down.
HARDENING = {
    "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "NoNewPrivileges": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "LockPersonality": "yes", "SystemCallArchitectures": "native",
    "UMask": "0027", "Group": "cartonstore",
}

EXPECTED_UNITS = [
    ("cartonstore.service", "Service", {
        **HARDENING,
        "Type": "notify",
        "ExecStart": "/usr/local/bin/cartonstore serve --config /etc/cartonstore/cartonstore.toml",
        "StateDirectory": "cartonstore",
        "RuntimeDirectory": "cartonstore",
        "RuntimeDirectoryPreserve": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        # runners: their own cgroups, their user, bubblewrap's namespaces, GPU device nodes
        "Delegate": "pids memory",
        "ProtectControlGroups": "no",
        "CapabilityBoundingSet": "CAP_SETUID CAP_SETGID CAP_SETFCAP CAP_SETPCAP CAP_CHOWN CAP_KILL",
        "RestrictNamespaces": "user mnt pid net ipc uts cgroup",
        "PrivateDevices": "no",
        "DevicePolicy": "closed",
    }),
    ("cartonstore.service", "Install", {"WantedBy": "multi-user.target", "Also": "cartonstore.socket"}),
    ("cartonstore.socket", "Socket", {
        "ListenStream": "/run/cartonstore/cartonstore.sock",
        "SocketMode": "0660",
        "SocketGroup": "cartonstore",
    }),
    ("cartonstore.socket", "Install", {"WantedBy": "sockets.target"}),
    ("cartonstore-gc.service", "Service", {
        **HARDENING,
        "Type": "oneshot",
        "ExecStart": "/usr/local/bin/cartonstore gc",
        "StateDirectory": "cartonstore",
        "ProtectControlGroups": "yes",
        "CapabilityBoundingSet": "",
    }),
    ("cartonstore-gc.timer", "Timer", {"OnCalendar": "hourly", "Persistent": "true"}),
    ("cartonstore-gc.timer", "Install", {"WantedBy": "timers.target"}),
]


@pytest.mark.parametrize(("name", "section", "expected"), EXPECTED_UNITS,
                         ids=[f"{name}[{section}]" for name, section, _ in EXPECTED_UNITS])
def test_unit_settings(name: str, section: str, expected: dict[str, str]) -> None:
    unit = read_unit(name)
    for key, want in expected.items():
        assert value(unit, section, key) == want, f"{name} [{section}] {key}"


def test_units_give_runners_their_user_and_gpus() -> None:
    unit = read_unit("cartonstore.service")
    assert not values(unit, "Service", "User"), "the daemon runs as root, to run runners as their own user"
    assert set(values(unit, "Service", "DeviceAllow")) >= {"char-nvidia-frontend rw", "char-nvidia-uvm rw"}
    sysusers = (REPO / "systemd" / "cartonstore.sysusers").read_text()
    assert any(line.split()[:2] == ["u", "cartonstore-runner"] for line in sysusers.splitlines())
    assert load_config(env={}).runners.user == "cartonstore-runner"


@pytest.mark.parametrize("name", ["cartonstore.service", "cartonstore-gc.service"])
def test_units_run_on_the_same_store(name: str) -> None:
    env = environment(read_unit(name))
    assert env["CARTONSTORE_ROOT"] == "/var/lib/cartonstore"  # = StateDirectory
    assert env["CARTONSTORE_SOCKET"] == value(read_unit("cartonstore.socket"), "Socket", "ListenStream")


def test_gc_reads_the_daemon_config_file() -> None:
    daemon = value(read_unit("cartonstore.service"), "Service", "ExecStart")
    gc_env = environment(read_unit("cartonstore-gc.service"))
    assert daemon.endswith(f"--config {gc_env[CONFIG_ENV]}")


def test_the_daemon_has_time_to_shut_down_gracefully() -> None:
    stop = parse_duration(value(read_unit("cartonstore.service"), "Service", "TimeoutStopSec"))
    assert stop > load_config(SHIPPED, env={}).server.shutdown_timeout


def test_memory_deny_write_execute_is_a_documented_choice() -> None:
    text = (UNITS / "cartonstore.service").read_text()
    assert not values(read_unit("cartonstore.service"), "Service", "MemoryDenyWriteExecute")
    assert "# MemoryDenyWriteExecute" in text


def test_gc_timer_is_spread_out() -> None:
    timer = read_unit("cartonstore-gc.timer")
    assert value(timer, "Timer", "RandomizedDelaySec") not in ("", "0")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    names = ["cartonstore.service", "cartonstore.socket", "cartonstore-gc.service", "cartonstore-gc.timer"]
    for name in names:
        # The binary is not installed here; verify checks that ExecStart exists.
        text = (UNITS / name).read_text().replace("/usr/local/bin/cartonstore", "/bin/true")
        (tmp_path / name).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], cwd=tmp_path,
                            check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if name_in(line, names)], result.stderr


def name_in(line: str, names: list[str]) -> bool:
    return any(name in line for name in names)


def test_auto_check_workers_is_one_per_core_at_most_eight() -> None:
    assert load_config(env={}).server.check_worker_count == max(1, min(8, len(os.sched_getaffinity(0))))
    assert load_config(env={}, overrides={"server.check_workers": 3}).server.check_worker_count == 3
    assert load_config(env={}, overrides={"server.check_workers": 0}).server.check_worker_count == 0


def test_self_test_tolerances_follow_the_models_device() -> None:
    from cartonstore.config.runners import RunnerSettings

    runners = RunnerSettings(selftest_rtol=1e-5, selftest_atol=1e-8, selftest_rtol_cuda=1e-2, selftest_atol_cuda=1e-4)
    assert runners.selftest_tolerances(["cpu"]) == (1e-5, 1e-8)
    assert runners.selftest_tolerances(["cpu", "cuda:1"]) == (1e-2, 1e-4)
    assert runners.selftest_tolerances([]) == (1e-5, 1e-8)


def test_registry_mirrors_are_tables_of_endpoints_by_host(tmp_path: Path) -> None:
    """[registries.mirrors."host"] endpoints = [...], as containerd's hosts.toml; a table, so tested apart."""
    path = tmp_path / "c.toml"
    path.write_text('[registries.mirrors."Registry.Lab:5000"]\nendpoints = ["http://127.0.0.1:30020/", '
                    '"https://cache.lab/v"]\n')
    config = load_config(path, env={})
    assert dict(config.registries.mirrors) == {"registry.lab:5000": ("http://127.0.0.1:30020", "https://cache.lab/v")}
    assert config.fetch_config().registries.mirrors == config.registries.mirrors
    for table, words in (('[registries.mirrors."https://r.lab"]\nendpoints = []', "is not a registry host"),
                         ('[registries.mirrors."r.lab"]\nendpoint = ["http://m"]', "expected endpoints = "),
                         ('[registries.mirrors."r.lab"]\nendpoints = ["ftp://m"]', "scheme 'ftp' is not allowed"),
                         ('[registries.mirrors."r.lab"]\nendpoints = ["http://m/?ns=x"]', "a query or fragment"),
                         ('[registries.mirrors."r.lab"]\nendpoints = ["https://m/v2"]', "without /v2"),
                         ('[registries.mirrors."r.lab"]\nendpoints = []\n[registries.mirrors."R.lab"]\n'
                          'endpoints = []', "listed twice")):
        path.write_text(table + "\n")
        with pytest.raises(InvalidInput, match="registries.mirrors") as raised:
            load_config(path, env={})
        assert words in str(raised.value), raised.value


@pytest.mark.parametrize("endpoint", ["https://user:s3cret@cache.lab/v2", "ftp://user:s3cret@cache.lab",
                                      "https://user:s3cret@cache.lab/?sig=abc"])
def test_registry_mirror_credentials_stay_out_of_messages(tmp_path: Path, endpoint: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[registries.mirrors."r.lab"]\nendpoints = ["{endpoint}"]\n')
    with pytest.raises(InvalidInput, match="registries.mirrors") as raised:
        load_config(path, env={})
    assert "s3cret" not in str(raised.value) and "sig=abc" not in str(raised.value)


def test_a_registry_mirror_the_policy_refuses_is_an_error(tmp_path: Path) -> None:
    """As for fetch.mirrors: a mirror that fetch.deny_hosts refuses would fail every pull."""
    path = tmp_path / "c.toml"
    path.write_text('[fetch]\ndeny_hosts = ["cache.lab"]\n[registries.mirrors."r.lab"]\n'
                    'endpoints = ["https://user:s3cret@cache.lab"]\n')
    with pytest.raises(InvalidInput) as raised:
        load_config(path, env={})
    message = str(raised.value)
    assert "registries.mirrors: registry mirror https://cache.lab would never be used" in message, message
    assert "is denied" in message and "s3cret" not in message
