"""The content-addressed store: blobs, index, materialized models."""

from .store import CartonInfo, RemoveResult, Store, VerifyReport, validate_name

__all__ = ["CartonInfo", "RemoveResult", "Store", "VerifyReport", "validate_name"]
