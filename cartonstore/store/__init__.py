"""The content-addressed store: blobs, index, materialized models."""

from .names import validate_name
from .store import CartonInfo, RemoveResult, Store, VerifyReport

__all__ = ["CartonInfo", "RemoveResult", "Store", "VerifyReport", "validate_name"]
