"""What sends a loaded model's requests to its runners once they started:
the dynamic batcher (batcher.py), the sequence router (sequences.py), or
the runners' own pick; and the load's model_transaction_policy held to
what the runners say they are (a runner streams or it does not)."""

from __future__ import annotations

from cartonstore.errors import InvalidInput

from .batcher import DynamicBatcher
from .loaded_model import LoadedModel
from .model_config import BatchingPolicy
from .sequence_config import SequencePolicy
from .sequences import SequenceRouter


def schedule(model: LoadedModel, batching: BatchingPolicy | None, sequencing: SequencePolicy | None,
             max_queued: int) -> None:
    """Give ``model`` (its runners started) the schedulers its load asks
    for; InvalidInput when its config says it is decoupled and its runners
    do not stream."""
    runners = model.runners
    if runners is None:
        return
    if ((model.config or {}).get("model_transaction_policy") or {}).get("decoupled") and not runners.decoupled:
        raise InvalidInput(f"config: model_transaction_policy says {model.name!r} is decoupled, but its runner "
                           f"answers one response per request (a python model streams with "
                           f"infer_stream_with_tensors, an SDK model with infer_stream)",
                           subject="model_transaction_policy")
    if batching is not None:
        model.batcher = DynamicBatcher(runners, batching, instances=len(runners.devices), max_queued=max_queued)
    if sequencing is not None:
        model.sequences = SequenceRouter(model.name, runners, sequencing, model.max_batch_size)
