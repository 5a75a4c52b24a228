"""Clients of a running daemon, on the standard library's HTTP over its
Unix socket (or TCP):

- leases.py: ``model_path`` (a context manager: a leased, read-only model
  directory), ``Client`` and ``AsyncClient`` (acquire, renew, release);
- infer.py: ``InferClient``, KServe v2 inference with binary tensors;
- wire.py: what both share (the address, one request per connection, error
  statuses, the keeper that renews a lease).

Names are imported on first use.
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "leases": "AsyncClient Client model_path",
    "infer": "InferClient",
    "wire": "DaemonUnavailable Lease",
})

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .infer import InferClient
    from .leases import AsyncClient, Client, model_path
    from .wire import DaemonUnavailable, Lease
