"""Cartons as OCI artifacts: pushed to and added from any OCI registry.

reference.py and artifact.py are pure (names and manifests); challenge.py
and credentials.py read auth challenges and docker's credentials; auth.py
answers challenges; registry.py speaks the distribution API; pull.py and
push.py move cartons between a registry and the store.

Entry points: ``push_carton`` (push.py) and, through fetch's hooks, adding
``oci://`` references with ``cartonstore.fetch.puller.Puller``: importing
this package registers the ``oci`` source kind and the registry challenge
answerer with ``cartonstore.fetch.hooks`` (fetch never imports oci). Only
reference.py is loaded here; the rest on first use.
"""

from __future__ import annotations

from typing import Any

from cartonstore.fetch.hooks import SourceKind, register_challenge_answerer, register_source_kind

from .reference import is_oci_reference, parse_reference


async def _add(puller: Any, text: str, name: str | None, force: bool) -> Any:
    from .pull import add_from_registry

    return await add_from_registry(puller, parse_reference(text), name, force)


def _answerer(client: Any) -> Any:
    from .auth import RegistryAuth
    from .credentials import docker_config_paths

    return RegistryAuth(docker_config_paths(client.config.registries.auth_file),
                        check_url=client.config.policy.check, route=lambda url: client.route(url, "registry"))


register_source_kind(SourceKind("oci", is_oci_reference, lambda text: str(parse_reference(text)), _add))
register_challenge_answerer(_answerer)

__all__ = ["is_oci_reference", "parse_reference"]
