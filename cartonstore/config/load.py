"""Settings of the daemon and the CLI: a TOML file, the environment, the command line.

    config = load_config(args.config, overrides={"server.listen": args.listen})

Every setting has the default a production node wants, so no file at all is
a working configuration; config/cartonstore.toml lists and explains them all.
Precedence, lowest first: defaults, the file (``path``, else
$CARTONSTORE_CONFIG), the environment variables in ENV_VARS, ``overrides``.
Every layer is checked whole, even where a higher one wins, so a broken file
is reported the day it breaks, not the day its override goes away.

Each problem raises InvalidInput naming where the value came from and its
dotted key, with ``subject`` the key (or the file, for unreadable files):

    config /etc/cartonstore/cartonstore.toml: fetch.retries: expected an integer >= 0, got 'many'
    environment CARTONSTORE_LISTEN: server.listen: '0.0.0.0:80' is not a loopback address; ...
    command line: unknown key 'server.lisen'; did you mean 'server.listen'?

Conventions, the same in every layer: an empty string means "the default"
for paths and ``accept_encoding``, and "no limit" for optional sizes (TOML
has no null); sizes and durations are strings ("256MiB", "1h30m") or plain
numbers (bytes, seconds). Relative paths in a file are relative to the
file's directory; elsewhere to the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.store.root.layout import default_root, default_socket
from cartonstore.system.hosts import is_loopback
from cartonstore.zipfmt import ZipLimits

from . import values as v
from .fetch import POLICY_FIELDS, FetchSettings
from .hf import HubSettings
from .mirror import MirrorSettings
from .peers import PeerSettings
from .registries import RegistrySettings
from .runners import RUNNER_TABLES, RunnerSettings
from .server import ServerSettings
from .values import duration_text, size_text  # noqa: F401 - part of this module's API

CONFIG_ENV = "CARTONSTORE_CONFIG"

ENV_VARS: Mapping[str, str] = MappingProxyType({
    "CARTONSTORE_ROOT": "store.root",
    "CARTONSTORE_SOCKET": "server.socket",
    "CARTONSTORE_LISTEN": "server.listen",
    "CARTONSTORE_GRPC_LISTEN": "server.grpc_listen",
    "CARTONSTORE_ID": "server.id",
    "CARTONSTORE_LOG_FORMAT": "server.log_format",
    "CARTONSTORE_LOG_LEVEL": "server.log_level",
    "CARTONSTORE_ACCESS_LOG": "server.access_log",
    "CARTONSTORE_SANDBOX": "runners.sandbox",
    "CARTONSTORE_ALLOW_PRIVATE_LINKS": "fetch.allow_private_links",
    "HF_ENDPOINT": "hf.endpoint",
    "HF_TOKEN": "hf.token",
})
"""Environment variable -> the setting it overrides. Empty variables are ignored."""


# -- the sections ------------------------------------------------------------------

_ZIP = ZipLimits()


def _default_root() -> Path:
    return default_root().expanduser().absolute()


@dataclass(frozen=True)
class StoreSettings:
    """[store]"""

    root: Path = v.setting(None, v.path(empty=v.DEFAULT), v.show_path,  # noqa: RUF009 - a field()
                          factory=_default_root)


@dataclass(frozen=True)
class LeaseSettings:
    """[leases]: time limits of the claims loaders hold on models."""

    default_ttl: float = v.duration_setting(60.0, positive=True)
    max_ttl: float = v.duration_setting(3600.0, positive=True)
    pin_ttl: float = v.duration_setting(120.0, positive=True)


@dataclass(frozen=True)
class LimitSettings:
    """[limits]: what a carton's zip may declare before it is refused."""

    zip_max_entries: int = v.setting(_ZIP.max_entries, v.integer(1))
    zip_max_ratio: int = v.setting(_ZIP.max_ratio, v.integer(1))


@dataclass(frozen=True)
class GcSettings:
    """[gc]: the store's space budget and how garbage is collected."""

    max_size: int | None = v.size_setting(None, 0, optional=True)
    min_free: int | None = v.size_setting(None, 0, optional=True)
    grace: float = v.duration_setting(3600.0, positive=False)
    interval: float = v.duration_setting(600.0, positive=True)
    forget_unrecoverable: bool = v.setting(False, v.boolean)


@dataclass(frozen=True)
class CacheSettings:
    """[cache]: Triton's response cache (server/models/response_cache.py)."""

    size: int = v.size_setting(0, 0)


_SECTIONS: Mapping[str, type] = MappingProxyType({
    "store": StoreSettings, "server": ServerSettings, "leases": LeaseSettings,
    "fetch": FetchSettings, "registries": RegistrySettings, "hf": HubSettings, "limits": LimitSettings,
    "gc": GcSettings, "cache": CacheSettings,
    "peers": PeerSettings, "runners": RunnerSettings, "mirror": MirrorSettings,
})
_PARSERS: Mapping[str, v.Parser] = MappingProxyType({
    f"{section}.{setting.name}": setting.metadata["parse"]
    for section, cls in _SECTIONS.items() for setting in fields(cls)
})


def setting_keys() -> tuple[str, ...]:
    """Every setting's dotted key ("server.listen"), in file order."""
    return tuple(_PARSERS)


@dataclass(frozen=True)
class Config:
    """All settings. ``Config()`` is the defaults; ``source`` is the file
    they were read from, if any (not compared)."""

    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    registries: RegistrySettings = field(default_factory=RegistrySettings)
    hf: HubSettings = field(default_factory=HubSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    gc: GcSettings = field(default_factory=GcSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    peers: PeerSettings = field(default_factory=PeerSettings)
    runners: RunnerSettings = field(default_factory=RunnerSettings)
    mirror: MirrorSettings = field(default_factory=MirrorSettings)
    source: Path | None = field(default=None, compare=False)

    @property
    def socket_path(self) -> Path:
        """server.socket, else store.layout.default_socket of the root."""
        return self.server.socket or default_socket(self.store.root)

    @property
    def grpc_socket_path(self) -> Path | None:
        """server.grpc_socket, else the HTTP socket's path with .grpc before
        its suffix (cartonstore.grpc.sock); None with server.grpc off."""
        if not self.server.grpc:
            return None
        http = self.socket_path
        return self.server.grpc_socket or http.with_name(f"{http.stem}.grpc{http.suffix or '.sock'}")

    def fetch_config(self) -> FetchConfig:
        values = {setting.name: getattr(self.fetch, setting.name) for setting in fields(self.fetch)
                  if setting.name not in POLICY_FIELDS}
        return FetchConfig(**values, policy=self.fetch.url_policy(), registries=self.registries.registry_config(),
                           peers=self.peers.peer_config(), hub=self.hf.hub_config())

    def zip_limits(self) -> ZipLimits:
        return ZipLimits(max_entries=self.limits.zip_max_entries,
                         max_ratio=self.limits.zip_max_ratio)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The settings as TOML-ready tables (sizes and durations as strings,
        the socket resolved), for ``serve --print-config``; loads back to
        the same settings."""
        tables = {
            name: {setting.name: setting.metadata["show"](getattr(section, setting.name))
                   for setting in fields(section)}
            for name, section in ((name, getattr(self, name)) for name in _SECTIONS)
        }
        tables["server"]["socket"] = str(self.socket_path)
        tables["runners"].update(tables["runners"].pop("commands"))  # back to [runners.<name>] tables
        return tables


# -- loading -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layer:
    origin: str                # how messages name it: "config F", "environment VAR", "command line"
    values: Mapping[str, Any]  # dotted key -> raw value
    base: Path | None          # relative paths are relative to this; None: the working directory


def load_config(path: Path | None = None, *, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, object] | None = None) -> Config:
    """Defaults, then the file, then ``env`` (default os.environ), then
    ``overrides`` (dotted keys; None values are skipped, so argparse results
    can be passed as they are). Raises InvalidInput for an unreadable file,
    invalid TOML, an unknown key or a bad value.

    ``path`` None means $CARTONSTORE_CONFIG, else no file. The default root
    is default_root(), which reads the process environment.
    """
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV]).expanduser()
    layers = [] if path is None else [_file_layer(Path(path))]
    layers += [_Layer(f"environment {var}", {key: env[var]}, None)
               for var, key in ENV_VARS.items() if env.get(var)]
    if overrides:
        layers.append(_Layer("command line",
                             {k: v for k, v in overrides.items() if v is not None}, None))
    return _build(layers, source=None if path is None else Path(path))


def _file_layer(path: Path) -> _Layer:
    origin = f"config {path}"
    import tomli  # imported here: most commands run with no settings file

    try:
        data = tomli.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise InvalidInput(f"{origin}: cannot read: {error.strerror or error}",
                           subject=str(path)) from None
    except UnicodeDecodeError as error:
        raise InvalidInput(f"{origin}: not UTF-8 text (bad byte at offset {error.start})",
                           subject=str(path)) from None
    except tomli.TOMLDecodeError as error:
        raise InvalidInput(f"{origin}: invalid TOML: {error}", subject=str(path)) from None
    return _Layer(origin, _flatten(data, origin), path.absolute().parent)


def _flatten(data: Mapping[str, Any], origin: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            if section in _SECTIONS:
                raise InvalidInput(f"{origin}: {section}: expected a table ([{section}]), "
                                   f"got {table!r}", subject=section)
            values[section] = table  # a key outside any section: reported as unknown
            continue
        if section not in _SECTIONS:
            hint = _suggest(section, list(_SECTIONS))
            raise InvalidInput(f"{origin}: unknown section [{section}]{hint}", subject=section)
        if section == "runners":  # [runners.<name>] tables are runner commands, one setting
            commands = {name: value for name, value in table.items()
                        if isinstance(value, dict) and name not in RUNNER_TABLES}
            table = {name: value for name, value in table.items() if name not in commands}
            if commands:
                values["runners.commands"] = commands
        values.update({f"{section}.{name}": value for name, value in table.items()})
    return values


def _suggest(name: str, candidates: list[str]) -> str:
    """"; did you mean 'x'?" for the likeliest candidate, "" if none is close.

    A known name in the wrong section is the likeliest slip, then a typo
    in the whole key, then a typo in the name alone."""
    import difflib  # imported here: only a mistake needs it

    leaves: dict[str, str] = {}
    for candidate in candidates:   # a name two sections share suggests the first (server.listen, not mirror.listen)
        leaves.setdefault(candidate.rpartition(".")[2], candidate)
    leaf = name.rpartition(".")[2]
    guess = leaves.get(leaf) \
        or next(iter(difflib.get_close_matches(name, candidates, n=1)), None) \
        or leaves.get(next(iter(difflib.get_close_matches(leaf, list(leaves), n=1)), ""))
    return f"; did you mean '{guess}'?" if guess else ""


def _build(layers: list[_Layer], *, source: Path | None) -> Config:
    values: dict[str, Any] = {}
    origins: dict[str, tuple[int, str]] = {}  # key -> (precedence, origin) of its value
    for precedence, layer in enumerate(layers):
        for key, raw in layer.values.items():
            values[key] = _parse(key, raw, layer)
            origins[key] = (precedence, layer.origin)
    sections = {
        name: cls(**{key.partition(".")[2]: value for key, value in values.items()
                     if key.startswith(name + ".") and value is not v.DEFAULT})
        for name, cls in _SECTIONS.items()
    }
    config = Config(**sections, source=source)
    _check(config, origins)
    return config


def _parse(key: str, raw: object, layer: _Layer) -> Any:
    parse = _PARSERS.get(key) if isinstance(key, str) else None
    if parse is None:
        raise InvalidInput(f"{layer.origin}: unknown key {key!r}{_suggest(str(key), list(_PARSERS))}",
                           subject=str(key))
    try:
        value = parse(raw)
    except (v.BadValue, InvalidInput) as error:
        raise InvalidInput(f"{layer.origin}: {key}: {error}", subject=key) from None
    if isinstance(value, Path) and not value.is_absolute():
        value = layer.base / value if layer.base else value.absolute()
    return value


def _check(config: Config, origins: Mapping[str, tuple[int, str]]) -> None:
    """Rules between settings; the message blames the key set last (see _conflict)."""
    server, leases, fetch = config.server, config.leases, config.fetch
    for key, address, text in (("server.listen", server.listen_address, server.listen),
                               ("server.grpc_listen", server.grpc_listen_address, server.grpc_listen),
                               ("mirror.listen", config.mirror.listen_address, config.mirror.listen)):
        if address and not server.allow_remote_listen and not is_loopback(address[0]):
            raise _conflict(origins, (key, "server.allow_remote_listen"),
                            f"{text!r} is not a loopback address (127.0.0.0/8, ::1, "
                            f"localhost): listening on other hosts needs server.allow_remote_listen = true, "
                            f"and server.token (or token_file) or server.tls_client_ca")
        if address and not is_loopback(address[0]) and not (server.token or server.token_file or server.tls_client_ca):
            raise _conflict(origins, (key, "server.token", "server.token_file", "server.tls_client_ca"),
                            f"{text!r} is not a loopback address and no credential is configured: "
                            f"set server.token (or server.token_file) or server.tls_client_ca, so that TCP "
                            f"callers must authenticate (anyone reaching the port could load code)")
    if leases.default_ttl > leases.max_ttl:
        raise _conflict(origins, ("leases.default_ttl", "leases.max_ttl"),
                        f"leases.default_ttl ({v.duration_text(leases.default_ttl)}) must not "
                        f"exceed leases.max_ttl ({v.duration_text(leases.max_ttl)})")
    if fetch.backoff_base > fetch.backoff_max:
        raise _conflict(origins, ("fetch.backoff_base", "fetch.backoff_max"),
                        f"fetch.backoff_base ({v.duration_text(fetch.backoff_base)}) must not "
                        f"exceed fetch.backoff_max ({v.duration_text(fetch.backoff_max)})")
    policy = fetch.url_policy()
    registry_mirrors = [url for urls in config.registries.mirrors.values() for url in urls]
    for key, what, urls in (("fetch.mirrors", "mirror", fetch.mirrors), ("peers.urls", "peer", config.peers.urls),
                            ("registries.mirrors", "registry mirror", registry_mirrors)):
        for url in urls:
            try:
                policy.check(url)
            except InvalidInput as error:
                raise _conflict(origins, (key, "fetch.allow_hosts", "fetch.deny_hosts"),
                                f"{what} {describe(url)} would never be used: {error}") from None



def _conflict(origins: Mapping[str, tuple[int, str]], keys: tuple[str, ...],
              problem: str) -> InvalidInput:
    """The error for ``keys`` that disagree, blaming the one set by the
    highest layer (the newest decision), the first of ``keys`` on a tie."""
    key = max(keys, key=lambda key: origins.get(key, (-1, ""))[0])
    origin = origins.get(key, (-1, "defaults"))[1]
    return InvalidInput(f"{origin}: {key}: {problem}", subject=key)
