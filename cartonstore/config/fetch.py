"""[fetch]: the fields of FetchConfig, with those of its UrlPolicy inline
(read by cartonstore.config)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from cartonstore.fetch.http.codings import DEFAULT_ACCEPT_ENCODING, SUPPORTED_CODINGS
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import UrlPolicy
from cartonstore.fetch.http.proxies import check_no_proxy, proxy_parser

from . import values as v

_FETCH = FetchConfig()
_POLICY = UrlPolicy()
POLICY_FIELDS = tuple(setting.name for setting in fields(UrlPolicy))

def _accept_encoding(value: object) -> str:
    if not isinstance(value, str):
        raise v.BadValue(f"expected an Accept-Encoding header value as a string, got {value!r}")
    if not value.strip():
        return DEFAULT_ACCEPT_ENCODING
    for item in value.split(","):
        coding = item.split(";", 1)[0].strip().lower()
        if coding not in (*SUPPORTED_CODINGS, "identity"):
            raise v.BadValue(f"coding {coding!r} cannot be decoded (this build decodes "
                             f"{DEFAULT_ACCEPT_ENCODING} and identity), got {value!r}")
    return value.strip()


def _check_mirrors(urls: tuple[str, ...]) -> None:
    for url in urls:
        v.url_prefix(url, what="a mirror is a URL prefix (blobs are <mirror>/<sha256>)")


@dataclass(frozen=True)
class FetchSettings:
    """[fetch]: the fields of FetchConfig, with those of its UrlPolicy inline."""

    accept_encoding: str = v.setting(_FETCH.accept_encoding, _accept_encoding)
    connect_timeout: float = v.duration_setting(_FETCH.connect_timeout, positive=True)
    stall_timeout: float = v.duration_setting(_FETCH.stall_timeout, positive=True)
    retries: int = v.setting(_FETCH.retries, v.integer(0))
    backoff_base: float = v.duration_setting(_FETCH.backoff_base, positive=False)
    backoff_max: float = v.duration_setting(_FETCH.backoff_max, positive=False)
    max_concurrency: int = v.setting(_FETCH.max_concurrency, v.integer(1))
    parallel_threshold: int = v.size_setting(_FETCH.parallel_threshold, 1)
    parallel_parts: int = v.setting(_FETCH.parallel_parts, v.integer(1))
    coalesce_gap: int = v.size_setting(_FETCH.coalesce_gap, 0)
    lock_timeout: float = v.duration_setting(_FETCH.lock_timeout, positive=True)
    max_blob_size: int | None = v.size_setting(_FETCH.max_blob_size, 1, optional=True)
    mirrors: tuple[str, ...] = v.setting(_FETCH.mirrors, v.strings(_check_mirrors))
    proxy: str | None = v.setting(None, proxy_parser("fetch.proxy"), lambda p: p or "")
    no_proxy: tuple[str, ...] = v.setting(_FETCH.no_proxy, v.strings(check_no_proxy))
    allow_hosts: tuple[str, ...] = v.setting(
        _POLICY.allow_hosts, v.strings(lambda hosts: UrlPolicy(allow_hosts=hosts)))
    deny_hosts: tuple[str, ...] = v.setting(
        _POLICY.deny_hosts, v.strings(lambda hosts: UrlPolicy(deny_hosts=hosts)))
    max_redirects: int = v.setting(_POLICY.max_redirects, v.integer(0))
    allow_private_links: bool = v.setting(_POLICY.allow_private_links, v.boolean)

    def url_policy(self) -> UrlPolicy:
        return UrlPolicy(**{name: getattr(self, name) for name in POLICY_FIELDS})
