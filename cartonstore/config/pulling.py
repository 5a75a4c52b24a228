"""The standard Puller: the store plus every kind of source cartonstore
reads (carton URLs, OCI references, Hugging Face repositories) and
registries' 401 answerer, built in one place for the daemon, the CLI and
local infer. fetch, oci and hf are imported on first use: commands that never fetch do not load them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cartonstore.fetch.http.config import FetchConfig
    from cartonstore.fetch.http.source_kinds import SourceKinds
    from cartonstore.fetch.puller import Puller
    from cartonstore.store import Store


def standard_sources() -> SourceKinds:
    from cartonstore.fetch.http.source_kinds import SourceKinds
    from cartonstore.fetch.puller import CARTON_URL
    from cartonstore.hf import HF_REFERENCE
    from cartonstore.oci import OCI_REFERENCE, registry_auth

    return SourceKinds((CARTON_URL, OCI_REFERENCE, HF_REFERENCE), registry_auth)


def standard_puller(store: Store, config: FetchConfig, *,
                    on_event: Callable[[dict[str, Any]], None] | None = None) -> Puller:
    from cartonstore.fetch.puller import Puller

    return Puller(store, config, sources=standard_sources(), on_event=on_event)
