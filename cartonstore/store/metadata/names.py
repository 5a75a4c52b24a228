"""Model names: what a valid name is, and who may move one.

A name is how loaders find a model, so it must never point somewhere new
without the user asking. Two kinds of name reach the store:

- an explicit name (``add --name``, a Triton load by name): the user asked
  for it, so it may move a name from another carton, and says that it did;
- a default name (the carton's own ``model_name``): applied only while it is
  free, never taken from another carton.

Moving the name of a model a daemon has loaded (its pin lease is live) is a
conflict unless forced: the daemon would go on serving the old version under
a name that now means the new one. Leases on the old carton stay valid.
Each daemon sharing the store pins in its own name (pin_lease_id), so two
that load one name keep a pin each.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cartonstore.errors import Conflict, InvalidInput
from cartonstore.store.root.owner import lease_owner

from .lease_rows import LeaseRow

MIN_PREFIX = 8
MAX_NAME_BYTES = 255
# Triton's model names: letters, digits, '_', '-', '.'; never a leading '.'
# (that would also allow '.' and '..', which are not names in a URL path) nor
# a leading '-' (a runner's command line would read it as an option).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
HEX = re.compile(r"[0-9a-f]+")
PIN_PREFIX = "pin:"         # pin:<owner>:<name>: a daemon keeps the model it loaded as <name>
SWITCH_PREFIX = "switch:"   # switch:<owner>:<name>: and the version it serves while it switches
# volume:<volume id>: a mounted volume (the CSI plugin's) holds the model. It has no expiry: the kubelet
# unpublishes every volume it published, retrying across the plugin's restarts, and a volume's files must
# stay while a pod runs however long the plugin is away; release alone ends it.
VOLUME_PREFIX = "volume:"
MAX_VOLUME_ID_BYTES = 512


def check_grammar(name: object, what: str = "name") -> str:
    """Return name if it is spelled as a model name or version may be
    (every door checks what a caller names with this one rule), else raise
    InvalidInput saying why."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"invalid {what} '': a {what} needs at least one character", subject=what)
    if len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidInput(f"invalid {what} {name[:40]!r}...: it is at most {MAX_NAME_BYTES} bytes", subject=what)
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"invalid {what} {name[:80]!r}: it uses only letters, digits, '_', '-' and '.', and does "
                           "not start with '.' or '-' (Triton's model-name rules)", subject=name[:80])
    return name


def check_model_ref(name: object, version: object = None) -> None:
    """What a request names (a model, and maybe its version) is spelled by
    check_grammar's rule, or InvalidInput: every door (HTTP, gRPC, the
    CLI) checks this before anything is looked up or reaches a runner."""
    check_grammar(name)
    if version is not None:
        check_grammar(version, "version")


def validate_name(name: str) -> str:
    """Return name if it can name a model, else raise InvalidInput saying why."""
    check_grammar(name)
    if len(name) >= MIN_PREFIX and HEX.fullmatch(name):
        raise InvalidInput(f"invalid name {name!r}: it would read as a manifest hash prefix", subject=name)
    return name


def is_valid_name(name: str) -> bool:
    try:
        validate_name(name)
    except InvalidInput:
        return False
    return True


@dataclass(frozen=True)
class NameOutcome:
    """What adding a carton did to its name."""

    name: str | None               # the name the carton now has (None: reachable by hash only)
    moved_from: str | None = None  # an explicit name taken from this carton
    kept_by: str | None = None     # a default name left with this carton
    wanted: str | None = None      # the name asked for or defaulted to

    def note(self, digest: str) -> str | None:
        """One line for the user when the name did something they should know."""
        if self.moved_from:
            return f"name {self.name}: {self.moved_from[:8]} \u2192 {digest[:8]}"
        if self.kept_by:
            return (f"name {self.wanted} is kept by {self.kept_by[:8]}; this carton is reachable "
                    f"by its hash {digest[:8]}")
        return None

    def as_json(self) -> dict[str, str | None]:
        return {"name": self.name, "moved_from": self.moved_from, "kept_by": self.kept_by}


def default_name(model_name: str | None) -> str | None:
    """A carton's model_name as a default name, or None when it cannot be
    one. A model_name written as other tools name models (``ORG/NAME``, a
    Hugging Face repository; ``name:tag``, an Ollama model) becomes
    ``ORG-NAME``, ``name-tag``: each run of characters a name may not hold
    is one dash."""
    if model_name is None:
        return None
    if is_valid_name(model_name):
        return model_name
    dashed = re.sub(r"[^A-Za-z0-9_.\-]+", "-", model_name).strip("-.")
    return dashed if is_valid_name(dashed) else None


def pin_lease_id(owner: str, name: str) -> str:
    """The lease by which the daemon whose owner token is ``owner``
    (owner.py) keeps the model it loaded as ``name``."""
    return f"{PIN_PREFIX}{owner}:{name}"


def volume_lease_id(volume_id: object) -> str:
    """The lease a mounted volume holds its model by; InvalidInput for a
    volume id that is not a non-empty string of at most MAX_VOLUME_ID_BYTES."""
    if not isinstance(volume_id, str) or not volume_id or len(volume_id.encode()) > MAX_VOLUME_ID_BYTES:
        raise InvalidInput(f"a volume id must be a non-empty string of at most {MAX_VOLUME_ID_BYTES} bytes, "
                           f"got {volume_id!r:.80}")
    return f"{VOLUME_PREFIX}{volume_id}"


def pinned_name(lease_id: str) -> str | None:
    """The name a pin lease keeps loaded; None for any other lease. A pin
    from before daemons named theirs (pin:<name>: no name holds ':') reads
    as one too; it has no owner to sweep it by and lapses at its expiry."""
    if not lease_id.startswith(PIN_PREFIX):
        return None
    if lease_owner(lease_id) is not None:
        return lease_id.split(":", 2)[2]
    rest = lease_id[len(PIN_PREFIX):]
    return rest if rest and ":" not in rest else None


def loaded_versions(conn: sqlite3.Connection, name: str) -> list[str]:
    """The cartons daemons have loaded under name (their pin leases are
    live), each once."""
    rows = conn.execute("SELECT id, carton FROM leases WHERE substr(id, 1, ?)=? AND expires_at>?",
                        (len(PIN_PREFIX), PIN_PREFIX, time.time())).fetchall()
    return sorted({carton for lease_id, carton in rows if pinned_name(lease_id) == name})


def removal_refused(digest: str, leases: Sequence[LeaseRow], now: float | None = None) -> Conflict:
    """Why ``rm`` may not take a carton, from its live leases: the names a
    daemon has it loaded as (and how to unload them), else each lease with
    its holder and expiry."""
    now = time.time() if now is None else now
    loaded = sorted({name for lease in leases if (name := pinned_name(lease.id)) is not None})
    pins = sum(1 for lease in leases if pinned_name(lease.id) is not None)
    if loaded:
        how = ", ".join(f"cartonstore unload {name}" for name in loaded)
        others = f" (and {len(leases) - pins} other lease(s))" if len(leases) > pins else ""
        return Conflict(f"carton {digest[:8]} is loaded as {', '.join(loaded)} by the daemon: unload it first: "
                        f"{how}{others}", subject=digest)
    held = "; ".join(f"lease {lease.id}" + (f" (holder {lease.holder!r})" if lease.holder else "")
                     + f" expires in {_seconds(lease.expires_at - now)}, at "
                     + time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(lease.expires_at))
                     for lease in leases)
    return Conflict(f"carton {digest[:8]} is leased: {held}; release the lease(s) (DELETE /v1/leases/ID) "
                    "or wait for them to expire", subject=digest)


def _seconds(s: float) -> str:
    s = max(0, round(s))
    return f"{s} s" if s < 120 else f"{s // 60} min {s % 60} s" if s < 7200 else f"{s // 3600} h {s // 60 % 60} min"


def check_move(conn: sqlite3.Connection, name: str, digest: str | None, *, force: bool) -> None:
    """Refuse to move a loaded model's name unless forced (Conflict names the version)."""
    if force:
        return
    loaded = [version for version in loaded_versions(conn, name) if version != digest]
    if loaded:
        raise Conflict(f"name {name} is loaded by the daemon as version {loaded[0][:8]}; unload it first "
                       f"(cartonstore unload {name}) or pass --force to move the name",
                       subject=name)


def assign_name(conn: sqlite3.Connection, digest: str, *, explicit: str | None, default: str | None,
                force: bool) -> NameOutcome:
    """Decide and write the carton's name inside the caller's transaction."""
    if explicit is not None:
        current = carton_named(conn, explicit)
        check_move(conn, explicit, digest, force=force)
        _write(conn, explicit, digest)
        moved = current if current is not None and current != digest else None
        return NameOutcome(explicit, moved_from=moved, wanted=explicit)
    if default is None:
        return NameOutcome(None)
    current = carton_named(conn, default)
    if current is None:
        _write(conn, default, digest)
        return NameOutcome(default, wanted=default)
    if current == digest:
        return NameOutcome(default, wanted=default)
    return NameOutcome(None, kept_by=current, wanted=default)


def carton_named(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT carton FROM names WHERE name=?", (name,)).fetchone()
    return row[0] if row else None


def _write(conn: sqlite3.Connection, name: str, digest: str) -> None:
    conn.execute("INSERT OR REPLACE INTO names VALUES (?,?,?)", (name, digest, time.time()))


def restore_name(conn: sqlite3.Connection, name: str, digest: str | None, *, only_from: str) -> None:
    """Point name back at digest (None: no carton), as before a failed load
    pointed it at only_from; a name someone else moved since is left alone,
    and a carton removed meanwhile is not pointed at."""
    current = carton_named(conn, name)
    if current == digest or current != only_from:
        return
    if digest is None:
        conn.execute("DELETE FROM names WHERE name=?", (name,))
    elif conn.execute("SELECT 1 FROM cartons WHERE digest=?", (digest,)).fetchone():
        _write(conn, name, digest)
