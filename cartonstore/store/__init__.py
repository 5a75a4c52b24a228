"""The content-addressed store, by job: root/ (where things live, locks,
tmp/ owners), content/ (the blob files), metadata/ (the SQLite index),
materialize/ (model directories, export views), gc/ (plans, collection,
holds). The top holds the operations that use them all: ``Store``
(store.py), the library the CLI and the daemon call; ingest.py (a carton
brought in: staged, checked, committed); verification.py; group_commit.py
(the daemon's index writer).

Entry points: ``Store``, ``validate_name``, ``VerifyReport``. Names are
imported on first use.
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

# `cartonstore.store.root.layout` alone (the settings need it for the default
# root) must not bring the whole store with it.
__getattr__, __dir__, __all__ = lazy_names(__name__, {"metadata.names": "validate_name",
                                                       "store": "CartonInfo RemoveResult Store",
                                                       "verification": "VerifyReport"})

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .metadata.names import validate_name
    from .store import CartonInfo, RemoveResult, Store
    from .verification import VerifyReport
