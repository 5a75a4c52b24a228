"""The content-addressed store: blobs named by their sha256 (blobs.py), one
SQLite index of cartons, entries, names, leases and sources (index.py;
read_only.py opens it for a user who may only read it),
read-only model directories built of hardlinks (materialize.py), garbage
collection (gc.py plans, collection.py applies) and verification.

Entry point: ``Store`` (store.py), the library the CLI and the daemon call;
``validate_name`` and ``VerifyReport`` too. Names are imported on first use.
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

# `cartonstore.store.layout` alone (the settings need it for the default
# root) must not bring the whole store with it.
__getattr__, __dir__, __all__ = lazy_names(__name__, {"names": "validate_name",
                                                       "store": "CartonInfo RemoveResult Store",
                                                       "verification": "VerifyReport"})

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .names import validate_name
    from .store import CartonInfo, RemoveResult, Store
    from .verification import VerifyReport
