"""Holds: leases a process takes on a carton while it completes or builds
it (cartonstore.fetch.holds), named after the process's owner token (see
owner.py), as daemons name their pins and switch leases (names.py). A
lease whose owner died is dropped by the next rm, collection or daemon
start at once, instead of blocking them until it expires: a SIGKILLed add
must not leave a carton un-removable for minutes, nor a SIGKILLed daemon
its models uncollectable."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from cartonstore.store.metadata.names import PIN_PREFIX, SWITCH_PREFIX
from cartonstore.store.root.owner import lease_owner, owner_is_gone, owner_token

if TYPE_CHECKING:
    from .parts import StoreParts

HOLD_PREFIX = "hold:"
OWNED_PREFIXES = (HOLD_PREFIX, PIN_PREFIX, SWITCH_PREFIX)   # <kind>:<owner token>:<what>


def new_hold_id(store: StoreParts) -> str:
    return f"{HOLD_PREFIX}{owner_token(store.layout.tmp_dir)}:{secrets.token_hex(6)}"


def drop_leases_of_gone_owners(store: StoreParts) -> int:
    """Delete the holds, pins and switch leases of processes that are gone
    (their owner lock is free); how many. A live process's are left alone,
    and it takes none in a token that is not yet locked (owner.py)."""
    ids = [lease_id for prefix in OWNED_PREFIXES for lease_id in store.index.lease_ids_with_prefix(prefix)]
    dead = [lease_id for lease_id in ids
            if (owner := lease_owner(lease_id)) is not None and owner_is_gone(store.layout.tmp_dir, owner)]
    if dead:
        store.index.delete_leases(dead)
    return len(dead)
