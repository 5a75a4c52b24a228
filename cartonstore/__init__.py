"""cartonstore: one content-addressed store of ML models (cartons) per host."""

__version__ = "0.1.0"

from .errors import (
    AlreadyExists,
    CartonStoreError,
    Conflict,
    IntegrityError,
    InvalidCarton,
    InvalidInput,
    NotFound,
    Unavailable,
)

__all__ = [
    "AlreadyExists", "CartonStoreError", "Conflict", "IntegrityError", "InvalidCarton",
    "InvalidInput", "NotFound", "Unavailable", "__version__",
]
