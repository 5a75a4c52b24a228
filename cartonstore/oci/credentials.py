"""Registry credentials where docker, skopeo and oras keep them.

A file in docker's config.json format: ``auths`` maps a registry
(``host[:port]``, or a URL such as ``https://host/v1/``) to ``auth``
(base64 of ``user:password``), ``username``/``password``, or an
``identitytoken`` (an OAuth2 refresh token); ``credHelpers`` maps a
registry to a credential helper and ``credsStore`` names the helper for all
others (``docker-credential-<helper> get``, the server on stdin, JSON with
Username and Secret on stdout; Username ``<token>`` means Secret is an
identity token).

Files are read in order: the cartonstore setting ``registries.auth_file``,
then ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``. The
first that names the registry wins.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cartonstore.errors import InvalidInput

HELPER_TIMEOUT = 30.0


@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""
    identity_token: str = ""     # an OAuth2 refresh token, traded at the token realm

    def __repr__(self) -> str:   # secrets never reach a log line
        return f"Credentials(username={self.username!r}, ...)"


def docker_config_paths(auth_file: Path | None, env: dict[str, str] | os._Environ | None = None) -> list[Path]:
    env = os.environ if env is None else env
    paths = [auth_file] if auth_file is not None else []
    if env.get("DOCKER_CONFIG"):
        paths.append(Path(env["DOCKER_CONFIG"]).expanduser() / "config.json")
    else:
        paths.append(Path("~/.docker/config.json").expanduser())
    return paths


def _registry_key(key: str) -> str:
    """"https://host:5000/v1/" -> "host:5000", as docker normalizes them."""
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key.split("/", 1)[0].lower()


def _read(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InvalidInput(f"registry credentials {path}: cannot read ({e.strerror})", subject=str(path)) from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInput(f"registry credentials {path}: not JSON ({e})", subject=str(path)) from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"registry credentials {path}: not a JSON object", subject=str(path))
    return doc


def _from_entry(entry: object, path: Path, key: str) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    where = f"registry credentials {path}: auths[{key!r}]"
    if entry.get("identitytoken"):
        return Credentials(username=str(entry.get("username") or ""), identity_token=str(entry["identitytoken"]))
    if entry.get("auth"):
        try:
            user, sep, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidInput(f"{where}.auth is not base64 of user:password", subject=str(path)) from None
        if not sep:
            raise InvalidInput(f"{where}.auth has no ':' between user and password", subject=str(path))
        return Credentials(user, password)
    if entry.get("username"):
        return Credentials(str(entry["username"]), str(entry.get("password") or ""))
    return None


def _from_helper(helper: str, authority: str, path: Path) -> Credentials | None:
    program = f"docker-credential-{helper}"
    try:
        done = subprocess.run([program, "get"], input=authority.encode(), capture_output=True,
                              timeout=HELPER_TIMEOUT, check=False)
    except FileNotFoundError:
        raise InvalidInput(f"registry credentials {path}: credential helper {program} (for {authority}) is not "
                           f"installed", subject=str(path)) from None
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"registry credentials {path}: {program} get did not answer within "
                           f"{HELPER_TIMEOUT:g}s", subject=str(path)) from None
    if done.returncode != 0:
        said = done.stdout.decode(errors="replace").strip() or done.stderr.decode(errors="replace").strip()
        if "credentials not found" in said.lower():
            return None
        raise InvalidInput(f"registry credentials {path}: {program} get failed: {said[:200]}", subject=str(path))
    try:
        doc = json.loads(done.stdout)
        user, secret = str(doc.get("Username") or ""), str(doc["Secret"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidInput(f"registry credentials {path}: {program} get printed no Username/Secret JSON",
                           subject=str(path)) from None
    return Credentials(identity_token=secret) if user == "<token>" else Credentials(user, secret)


def find_credentials(authority: str, paths: list[Path]) -> Credentials | None:
    """The credentials for ``host[:port]`` in the first file that names it."""
    authority = authority.lower()
    for path in paths:
        doc = _read(path)
        if doc is None:
            continue
        helpers: dict[str, Any] = doc["credHelpers"] if isinstance(doc.get("credHelpers"), dict) else {}
        for key, helper in helpers.items():
            if _registry_key(key) == authority and isinstance(helper, str):
                return _from_helper(helper, authority, path)
        auths: dict[str, Any] = doc["auths"] if isinstance(doc.get("auths"), dict) else {}
        for key, entry in auths.items():
            if _registry_key(key) == authority and (found := _from_entry(entry, path, key)) is not None:
                return found
        if isinstance(doc.get("credsStore"), str) and doc["credsStore"] and \
                (found := _from_helper(doc["credsStore"], authority, path)) is not None:
            return found
    return None
