"""Where things live under a store root (docs/design.md, "The store on disk")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cartonstore.errors import Unavailable
from cartonstore.format.digest import is_sha256


@dataclass(frozen=True)
class StoreLayout:
    root: Path

    @property
    def index_db(self) -> Path:
        return self.root / "index.db"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    def blob_path(self, digest: str) -> Path:
        if not is_sha256(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.blobs_dir / digest[:2] / digest

    def model_path(self, digest: str) -> Path:
        if not is_sha256(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.models_dir / digest

    def model_dir_str(self, digest: str) -> str:
        """model_path as a str, for a digest read from the index (already a
        sha256): leases are answered thousands of times a second, and
        building and checking a Path was 7% of the daemon's time."""
        return self._models_prefix + digest

    @cached_property
    def _models_prefix(self) -> str:
        return f"{self.models_dir}{os.sep}"

    def create(self) -> None:
        """Make the directory skeleton; group-readable so a group can share it."""
        for d in (self.blobs_dir, self.models_dir, self.tmp_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)


SOCKET_NAME = "cartonstore.sock"
"""The daemon's socket in a store root, unless server.socket says otherwise."""

SYSTEM_ROOT = Path("/var/lib/cartonstore")
"""The host's store: root's default, and systemd's StateDirectory."""

SYSTEM_SOCKET = Path("/run/cartonstore") / SOCKET_NAME
"""The system store's socket: in /run (systemd's RuntimeDirectory, what
cartonstore.socket listens on), where it does not outlive a boot."""

SYSTEM_SOCKET_DIR_MODE = 0o755
"""/run/cartonstore's mode when the daemon makes it: anyone may pass
through, the socket's own mode (server.socket_mode) decides who connects
(as RuntimeDirectoryMode in cartonstore.service)."""


def default_root() -> Path:
    """$CARTONSTORE_ROOT, else $XDG_CACHE_HOME/cartonstore, else the host's
    store /var/lib/cartonstore for root and ~/.cache/cartonstore for
    anyone else. The daemon, the CLI and the client all ask this one
    function, so that a root CLI finds a root daemon's store."""
    env = os.environ.get("CARTONSTORE_ROOT")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache:
        return Path(cache) / "cartonstore"
    if os.geteuid() == 0:
        return SYSTEM_ROOT
    return Path(os.path.expanduser("~")) / ".cache" / "cartonstore"


def default_socket(root: Path) -> Path:
    """The daemon's socket for the store at ``root`` when server.socket (or
    $CARTONSTORE_SOCKET) names none: /run/cartonstore/cartonstore.sock for
    the host's store, whoever asks (a group member naming the store finds
    the daemon), else ``cartonstore.sock`` in the root."""
    return SYSTEM_SOCKET if root == SYSTEM_ROOT else root / SOCKET_NAME


def make_socket_dir(socket: Path) -> None:
    """Make /run/cartonstore when the daemon's socket is to be there and
    nothing (systemd's RuntimeDirectory) has made it since boot: mode
    SYSTEM_SOCKET_DIR_MODE whatever the umask. Other sockets' directories
    are the operator's to make (binding there names a missing one)."""
    directory = socket.parent
    if directory != SYSTEM_SOCKET.parent:
        return
    try:
        os.mkdir(directory, SYSTEM_SOCKET_DIR_MODE)
    except FileExistsError:
        return
    except OSError as error:
        raise Unavailable(f"cannot create the socket directory {directory}: {error.strerror}",
                          subject=str(directory)) from None
    os.chmod(directory, SYSTEM_SOCKET_DIR_MODE)
