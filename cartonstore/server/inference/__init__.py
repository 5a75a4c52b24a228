"""The inference core: the one path every door (the native HTTP front
``server/http/``, the aiohttp routes ``server/api/``, gRPC ``server/rpc/``)
takes to run a request. A door resolves the model (``serving_or_loadable``:
``serving_model``, or None for one ``infer`` loads on demand),
hands an ``InferCall`` (an HTTP body as it came, or a request it parsed
from its own message) to ``infer`` and translates the ``InferAnswer``, or
the CartonStoreError (``status_of``), back to its wire. Here: the checks
(checks.py), batching or an instance and the arena (pipeline.py), the
answer (answer.py), the statistics (phases.py), the model's config and
statistics (models.py). Imports no aiohttp, no grpc, no door.
"""

from .answer import STREAM_ANSWER, InferAnswer, widen_send_buffer
from .errors import StatusError, status_of
from .models import arena_slot_for, config_of, ready_model, serving_model, serving_or_loadable, statistics
from .pipeline import InferCall, infer

__all__ = ["STREAM_ANSWER", "InferAnswer", "InferCall", "StatusError", "arena_slot_for", "config_of", "infer",
           "ready_model", "serving_model", "serving_or_loadable", "statistics", "status_of", "widen_send_buffer"]
