"""Cartons as OCI artifacts: pushed to and added from any OCI registry.

reference.py, artifact.py and model_formats.py are pure (names, a
carton's manifest, the model formats other tools push); challenge.py and
credentials.py read auth challenges and docker's credentials; auth.py
answers challenges; registry.py speaks the distribution API; pull.py,
model_pull.py (with layer_blobs.py and unpack.py, tar layers unpacked as
they stream) and push.py move cartons and models between a registry and
the store;
modelpack.py (pure) lays a carton out as a CNCF ModelPack artifact for
``push --format modelpack``.

Entry points: ``push_carton`` (push.py); ``OCI_REFERENCE``, the source
kind a ``cartonstore.fetch.puller.Puller`` built with it reads ``oci://``
references by, and ``registry_auth``, its answerer of registries' 401
challenges (``cartonstore.config.pulling`` hands both to the pullers it
builds; fetch never imports oci). Only reference.py is loaded here; the
rest on first use.
"""

from __future__ import annotations

from typing import Any

from cartonstore.fetch.http.source_kinds import SourceKind

from .reference import SCHEME, is_oci_reference, parse_reference


async def _add(puller: Any, ref: str, name: str | None, force: bool, lazy: bool) -> Any:
    from .pull import add_from_registry

    return await add_from_registry(puller, parse_reference(ref), name, force, lazy)


def registry_auth(client: Any) -> Any:
    """The answerer of one HttpClient's 401 challenges: docker's credentials,
    Basic and Bearer tokens (auth.py)."""
    from .auth import RegistryAuth
    from .credentials import docker_config_paths

    return RegistryAuth(docker_config_paths(client.config.registries.auth_file),
                        check_url=client.config.policy.check, route=lambda url: client.route(url, "registry"))


OCI_REFERENCE = SourceKind("oci", (SCHEME.removesuffix("://"),), lambda _puller, text: str(parse_reference(text)),
                           _add)
"""A carton or a model in an OCI registry, ``oci://HOST/REPO:TAG`` (reference.py)."""

__all__ = ["OCI_REFERENCE", "is_oci_reference", "parse_reference", "registry_auth"]
