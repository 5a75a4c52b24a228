"""Where a registry's blobs and manifests are asked at its mirrors
([registries.mirrors."host"] endpoints, as containerd's hosts.toml): one
rule for a pull (cartonstore.oci) and for fetching an evicted blob again
from the registry URL its index records (blob_fetcher.py). Pure: URLs in,
URLs out.

A mirror is asked for ``<endpoint>/v2/<repository>/<path>?ns=<registry>``:
the ``ns`` query parameter names the registry it stands in for, as
containerd sends it (Spegel and Dragonfly read it). The registry's own URL
stays what is recorded: mirrors are a node's configuration of the day.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote

# a blob at a registry, as oci/registry.py's source_url records it
_REGISTRY_BLOB = re.compile(r"^https?://([^/?#]+)/v2/([^?#]+)/blobs/(sha256:[0-9a-f]{64})$")


def mirror_url(endpoint: str, repository: str, authority: str, path: str) -> str:
    """``path`` (``blobs/sha256:...``, ``manifests/...``) of ``repository``
    of the registry at ``authority``, asked at the mirror ``endpoint``."""
    return f"{endpoint.rstrip('/')}/v2/{repository}/{path}?ns={quote(authority, safe=':')}"


def mirrored_blob_urls(url: str, mirrors: Mapping[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """(endpoint, URL) of each mirror for ``url`` when it is a blob at a
    registry that ``mirrors`` (host[:port], lower case, -> endpoints)
    lists, in order; [] for any other URL."""
    found = _REGISTRY_BLOB.match(url)
    if found is None:
        return []
    authority, repository, digest = found.groups()
    return [(endpoint, mirror_url(endpoint, repository, authority, f"blobs/{digest}"))
            for endpoint in mirrors.get(authority.lower(), ())]


def pulled_from(url: str, sources: Iterable[str]) -> bool:
    """Whether ``url`` is a blob at the registry repository one of
    ``sources`` (cartons' sources, ``oci://HOST[:PORT]/REPO:TAG@DIGEST``
    as cartonstore.oci records a pull) names: a URL a caller's reference
    gave, not one a carton named."""
    found = _REGISTRY_BLOB.match(url)
    if found is None:
        return False
    authority, repository, _ = found.groups()
    prefix = f"oci://{authority}/{repository}"
    return any(source.startswith(prefix) and source[len(prefix):len(prefix) + 1] in (":", "@") for source in sources)


def registry_of(url: str) -> str:
    """The host[:port] of a registry blob URL (for what is logged)."""
    found = _REGISTRY_BLOB.match(url)
    return found[1] if found is not None else url
