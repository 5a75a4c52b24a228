"""Holds: leases a process takes on a carton while it completes or builds
it (cartonstore.fetch.holds), named after the process's owner token (see
owner.py). A hold whose owner died is dropped by the next rm or collection
at once, instead of blocking them until it expires: a SIGKILLed add must
not leave a carton un-removable for minutes."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from .owner import owner_is_gone, owner_token

if TYPE_CHECKING:
    from .parts import StoreParts

HOLD_PREFIX = "hold:"


def new_hold_id(store: StoreParts) -> str:
    return f"{HOLD_PREFIX}{owner_token(store.layout.tmp_dir)}:{secrets.token_hex(6)}"


def drop_orphan_holds(store: StoreParts) -> int:
    """Delete the holds of processes that are gone; how many. The caller
    holds the store lock (so no hold is being taken meanwhile)."""
    ids = store.index.lease_ids_with_prefix(HOLD_PREFIX)
    dead = [i for i in ids if owner_is_gone(store.layout.tmp_dir, i[len(HOLD_PREFIX):].split(":", 1)[0])]
    if dead:
        store.index.delete_leases(dead)
    return len(dead)
