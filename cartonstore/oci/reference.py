"""``oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX]``: a carton in an OCI registry.

Pure. The grammar is the distribution project's reference grammar (what
docker, skopeo and oras accept), with ``oci://`` in front so a reference is
never mistaken for a store name or a path: path components of lowercase
letters and digits joined by ``.``, ``_``, ``__`` or runs of ``-``; a tag
of word characters, ``.`` and ``-`` (128 at most, not starting with ``.``
or ``-``); a digest ``sha256:`` and 64 lowercase hex digits. Neither tag
nor digest means ``latest``, as docker reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cartonstore.errors import InvalidInput

SCHEME = "oci://"
DEFAULT_TAG = "latest"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
MAX_REPOSITORY = 255


def is_oci_reference(text: str) -> bool:
    return text.startswith(SCHEME)


@dataclass(frozen=True)
class OciReference:
    authority: str          # host[:port] as written ("[::1]:5000" for IPv6)
    repository: str
    tag: str | None = None
    digest: str | None = None   # "sha256:<hex>"

    @property
    def host(self) -> str:
        """The host without port or IPv6 brackets."""
        if self.authority.startswith("["):
            return self.authority[1:self.authority.index("]")]
        return self.authority.rpartition(":")[0] if ":" in self.authority else self.authority

    @property
    def reference(self) -> str:
        """What follows /manifests/: the digest when known, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def with_digest(self, digest: str) -> OciReference:
        return OciReference(self.authority, self.repository, self.tag or (None if self.digest else DEFAULT_TAG),
                            digest)

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{SCHEME}{self.authority}/{self.repository}{tag}{digest}"


def parse_reference(text: str) -> OciReference:
    """Parse an oci:// reference; InvalidInput names what is wrong with it."""
    if not is_oci_reference(text):
        raise InvalidInput(f"{text!r} is not an OCI reference (oci://HOST/REPO:TAG)", subject=text)
    rest = text[len(SCHEME):]
    authority, slash, path = rest.partition("/")
    if not _HOST.fullmatch(authority):
        raise InvalidInput(f"{text!r}: {authority!r} is not a registry host[:port]", subject=text)
    if authority.rpartition(":")[2].isdigit() and not 0 < int(authority.rpartition(":")[2]) < 65536:
        raise InvalidInput(f"{text!r}: port out of range", subject=text)
    if not slash or not path:
        raise InvalidInput(f"{text!r}: no repository after the host (oci://HOST/REPO:TAG)", subject=text)
    digest = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST.fullmatch(digest):
            raise InvalidInput(f"{text!r}: {digest!r} is not a sha256 digest (sha256: and 64 lowercase hex "
                               f"digits)", subject=text)
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise InvalidInput(f"{text!r}: {tag!r} is not a valid tag (letters, digits, _ . -; at most 128, "
                               f"not starting with . or -)", subject=text)
    if not _REPOSITORY.fullmatch(path):
        raise InvalidInput(f"{text!r}: {path!r} is not a valid repository name (lowercase path components of "
                           f"letters and digits, joined by . _ __ or -)", subject=text)
    if len(path) > MAX_REPOSITORY:
        raise InvalidInput(f"{text!r}: the repository name is longer than {MAX_REPOSITORY} characters",
                           subject=text)
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return OciReference(authority, path, tag, digest)
