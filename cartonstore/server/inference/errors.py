"""The one error type of the inference core: every failure is a
CartonStoreError, whose HTTP status (errors.http_status_for) each door
translates into its own (gRPC: a status code). A runner's error answer,
for a door that has no answer of that form, is a StatusError carrying the
status the runner gave."""

from __future__ import annotations

from cartonstore.errors import CartonStoreError, http_status_for


class StatusError(CartonStoreError):
    """An error that stands for an HTTP status of its own (a runner's error
    answer; a call cartonstore does not implement)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def status_of(exc: CartonStoreError) -> int:
    """The HTTP status that answers ``exc``."""
    return exc.status if isinstance(exc, StatusError) else http_status_for(exc)
