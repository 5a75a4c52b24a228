"""Before a model directory is handed out: the blobs it holds that were
adopted from another tool's file (store/adoption.py) are as adopted.

Such a blob and the other tool's file are one inode, so a write in place
through the other path changes what the store serves. Its stat (size,
mtime, inode) is compared with the row recorded when it was adopted; one
that moved is rehashed: sound bytes (a touch) get the new stat recorded,
changed ones are quarantined as verify --repair does, the model
directories that hold them taken away, and the carton refused until the
blob is added or adopted again. A change in place that keeps size and
mtime is caught by ``verify``, which rehashes every blob.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cartonstore.errors import IntegrityError
from cartonstore.store.metadata.adopted_rows import AdoptedBlob, adopted_of_carton, cartons_listing, record_adopted

if TYPE_CHECKING:
    from cartonstore.store.gc.parts import StoreParts


def refuse_changed(store: StoreParts, carton: str) -> None:
    """IntegrityError naming the file when an adopted blob the carton lists
    changed (see the module's doc); one cheap look when nothing is adopted."""
    for row in store.index.read(lambda conn: adopted_of_carton(conn, carton)):
        try:
            st = os.stat(store.blobs.path(row.digest))
        except FileNotFoundError:
            continue   # missing: materializing says so, and fetching brings it back
        change = row.change(st)
        if change is None:
            continue
        if st.st_size == row.size and store.blobs.rehash(row.digest) == row.digest:
            if not store.index.read_only:
                with store.index.transaction() as conn:
                    record_adopted(conn, [AdoptedBlob.of(row.digest, row.path, st)])
            continue
        _put_away(store, row.digest)
        raise IntegrityError(f"blob {row.digest} of carton {carton}, adopted from {row.path}, was changed through "
                             f"that path ({change}): it is not served; it was quarantined, and adding or adopting "
                             "the model again brings it back", subject=row.digest)


def _put_away(store: StoreParts, digest: str) -> None:
    if store.index.read_only:
        return
    from cartonstore.store.materialize.tree import remove_tree

    from .verification import quarantine_blob

    with store.lock():
        if not store.blobs.has(digest):
            return
        quarantine_blob(store, digest)
        trash = [store.take_model_away(c) for c in store.index.read(lambda conn: cartons_listing(conn, digest))]
    for away in trash:
        if away is not None:
            remove_tree(away)
