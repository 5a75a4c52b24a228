"""The content-addressed store: blobs, index, materialized models."""

from cartonstore.system.lazy_names import lazy_names

# `cartonstore.store.layout` alone (the settings need it for the default
# root) must not bring the whole store with it (issue 14).
__getattr__, __dir__, __all__ = lazy_names(__name__, {"names": "validate_name",
                                                       "store": "CartonInfo RemoveResult Store",
                                                       "verification": "VerifyReport"})
