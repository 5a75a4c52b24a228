"""What the node plugin does with a volume, in blocking calls (the gRPC
servicer runs each in its worker thread): check what the kubelet asks,
lease the model through the daemon, bind its directory read-only at the
target, and undo both.

The plugin keeps no state of its own, so a restarted plugin knows what the
one before it did: the mount table says which model each target holds, and
a volume's lease is named by its volume id (``volume:<id>``, no expiry,
store/metadata/names.py), so the unpublish of a volume published before a
restart releases the very lease that publish took.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cartonstore.client import Client, Lease
from cartonstore.errors import AlreadyExists, CartonStoreError, IntegrityError, InvalidInput, NotFound
from cartonstore.store.metadata.names import is_valid_name, volume_lease_id

from .mountinfo import Mount, mounts_at
from .mounts import bind_read_only, read_mounts, unmount

log = logging.getLogger(__name__)

MODEL_KEY = "model"
PIN_KEY = "sha256"
KUBERNETES_KEYS = "csi.storage.k8s.io/"   # what the kubelet adds (pod name, namespace, ephemeral, ...)
SOURCE_SCHEMES = ("oci", "hf", "https", "http")
_SHA256 = re.compile(r"[0-9a-f]{64}")
PROBE_TTL = 60.0   # seconds a lease taken only to learn what a model reference names may last


@dataclass(frozen=True)
class Publish:
    """A NodePublishVolume request, checked."""
    volume_id: str
    target: Path
    model: str
    pin: str | None


def check_publish(volume_id: str, target_path: str, context: dict[str, str], *, is_block: bool) -> Publish:
    """The request, or InvalidInput naming what is wrong with it."""
    volume_lease_id(volume_id)
    target = check_target(target_path)
    if is_block:
        raise InvalidInput("a model volume is a directory: ask for a mount volume capability, not block")
    unknown = sorted(k for k in context if k not in (MODEL_KEY, PIN_KEY) and not k.startswith(KUBERNETES_KEYS))
    if unknown:
        raise InvalidInput(f"unknown volumeAttributes {unknown}: a model volume takes {MODEL_KEY!r} and "
                           f"optionally {PIN_KEY!r}")
    model = context.get(MODEL_KEY, "").strip()
    if not model:
        raise InvalidInput(f"volumeAttributes has no {MODEL_KEY!r}: name a stored model or a source "
                           "(oci://, hf://, https://.../x.carton)")
    check_model(model)
    pin = context.get(PIN_KEY)
    if pin is not None:
        pin = pin.strip().lower().removeprefix("sha256:")
        if not _SHA256.fullmatch(pin):
            raise InvalidInput(f"volumeAttributes {PIN_KEY!r} must be a manifest hash (64 hex digits), "
                               f"got {context[PIN_KEY]!r:.80}")
    return Publish(volume_id, target, model, pin)


def check_model(model: str) -> None:
    """A stored name or manifest hash, or a source of a scheme the daemon
    fetches. Never a path: the daemon would read it on the node, as root."""
    scheme, sep, _rest = model.partition("://")
    if sep:
        if scheme.lower() not in SOURCE_SCHEMES:
            raise InvalidInput(f"model {model!r:.200}: unknown source scheme {scheme!r}; a volume's model is a "
                               f"stored name or a source of {', '.join(s + '://' for s in SOURCE_SCHEMES)}")
    elif not is_valid_name(model) and not _SHA256.fullmatch(model):
        raise InvalidInput(f"model {model!r:.200} is neither a stored model's name nor a manifest hash nor a "
                           "source URL (a path on the node is not a volume's model)")


def check_target(target_path: str) -> Path:
    if not target_path:
        raise InvalidInput("target_path is empty")
    if not os.path.isabs(target_path):
        raise InvalidInput(f"target_path {target_path!r:.200} is not absolute")
    return Path(os.path.realpath(target_path))


@dataclass(frozen=True)
class Usage:
    """What a mounted volume holds (NodeGetVolumeStats)."""
    digest: str
    bytes: int
    files: int
    abnormal: bool
    message: str


class Volumes:
    """The node's model volumes, through the daemon at ``client``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._guard = threading.Lock()
        self._target_locks: dict[Path, tuple[threading.Lock, int]] = {}   # the lock, and the calls needing it

    @contextlib.contextmanager
    def target_lock(self, target: Path) -> Iterator[None]:
        """One call at a time on a target: a retry the kubelet sends while
        this plugin still finishes the call before it waits for it. The
        lock goes when no call needs it (targets are one per pod)."""
        with self._guard:
            lock, users = self._target_locks.get(target, (threading.Lock(), 0))
            self._target_locks[target] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._target_locks[target]
                if users == 1:
                    del self._target_locks[target]
                else:
                    self._target_locks[target] = (lock, users - 1)

    def found(self) -> list[Mount]:
        """The model directories bound anywhere on this node: what a plugin
        started before this one published."""
        return [m for m in read_mounts() if m.model_digest is not None]

    def publish(self, p: Publish, timeout: float) -> None:
        """Lease and bind; ``timeout``: seconds the daemon may take to fetch
        (past them Unavailable from a TimeoutError: the fetch goes on in the
        daemon, and the kubelet's retry waits for the same one)."""
        with self.target_lock(p.target):
            self._publish(p, timeout)

    def _publish(self, p: Publish, timeout: float) -> None:
        mounted = model_at(p.target)
        if mounted is not None:
            wanted = p.pin or self.digest_of(p.model, timeout)
            if wanted != mounted:
                raise AlreadyExists(f"{p.target} already holds model {mounted}, not {p.model} ({wanted})",
                                    subject=str(p.target))
            self.client.acquire_for_volume(mounted, p.volume_id, timeout=timeout)   # kept, or taken again
            return
        lease = self.lease(p, timeout)
        try:
            p.target.mkdir(parents=True, exist_ok=True)
            bind_read_only(lease.path, p.target)
        except (OSError, CartonStoreError):
            self.release(p.volume_id)
            raise
        log.info("volume %s: model %s (%s) bound read-only at %s", p.volume_id, p.model,
                 lease.manifest_sha256, p.target)

    def lease(self, p: Publish, timeout: float) -> Lease:
        """The volume's lease: on the pinned hash when the store holds it,
        else on the model (fetched if missing), checked against the pin."""
        if p.pin is not None:
            try:
                return self.client.acquire_for_volume(p.pin, p.volume_id, timeout=timeout)
            except NotFound:
                pass
        lease = self.client.acquire_for_volume(p.model, p.volume_id, timeout=timeout)
        if p.pin is not None and lease.manifest_sha256 != p.pin:
            self.release(p.volume_id)
            raise IntegrityError(f"model {p.model} is {lease.manifest_sha256}, not the pinned {PIN_KEY} {p.pin}",
                                 subject=p.model)
        return lease

    def digest_of(self, model: str, timeout: float) -> str:
        """The manifest hash ``model`` names now, by a short lease given back at once."""
        if _SHA256.fullmatch(model):
            return model
        lease = self.client.acquire(model, PROBE_TTL, holder="csi: what a volume's model names", timeout=timeout)
        self.client.release(lease.id)
        return lease.manifest_sha256

    def unpublish(self, volume_id: str, target: Path) -> None:
        """Unmount everything at ``target``, remove it, release the lease;
        each step already done is skipped, so a retry, or a volume this node
        never published, is OK."""
        with self.target_lock(target):
            self._unpublish(volume_id, target)

    def _unpublish(self, volume_id: str, target: Path) -> None:
        for _mount in mounts_at(read_mounts(), str(target)):
            unmount(target)
        try:
            target.rmdir()
        except FileNotFoundError:
            pass
        self.release(volume_id)
        log.info("volume %s: unmounted from %s and released", volume_id, target)

    def release(self, volume_id: str) -> None:
        try:
            self.client.release(volume_lease_id(volume_id))
        except NotFound:
            pass

    def usage(self, volume_path: Path) -> Usage:
        at = mounts_at(read_mounts(), str(volume_path))
        if not at or at[-1].model_digest is None:
            raise NotFound(f"no model volume is mounted at {volume_path}", subject=str(volume_path))
        mount = at[-1]
        size = files = 0
        for folder, _dirs, names in os.walk(volume_path):
            for name in names:
                size += os.lstat(os.path.join(folder, name)).st_size
                files += 1
        digest = str(mount.model_digest)
        if mount.is_deleted:
            return Usage(digest, size, files, True, f"model {digest}'s directory was removed under the mount")
        if not mount.is_read_only:
            return Usage(digest, size, files, True, f"model {digest} is mounted writable")
        return Usage(digest, size, files, False, f"model {digest}, mounted read-only")


def model_at(target: Path) -> str | None:
    """The manifest hash of the model bound at ``target``; None when nothing
    is mounted there; AlreadyExists when something else is."""
    at = mounts_at(read_mounts(), str(target))
    if not at:
        return None
    digest = at[-1].model_digest
    if digest is None:
        raise AlreadyExists(f"{target} holds a {at[-1].fstype} mount that is not a model's directory",
                            subject=str(target))
    return digest
