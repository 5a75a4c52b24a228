"""The model (version) a request names, as the inference core serves it:
READY, with runners or as files only; its arena slot for a big request;
its Triton configuration and statistics. What every door resolves first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput, NotFound
from cartonstore.server.models.loaded_model import triton_unknown_model
from cartonstore.server.models.model_config import model_config
from cartonstore.server.models.runtime import no_runner_reason
from cartonstore.server.tensors.arena import ARENA_FROM, ArenaSlot
from cartonstore.store.metadata.names import check_model_ref
from cartonstore.v2.statistics import InferStatistics, statistics_answer

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel
    from cartonstore.server.models.service import ModelService

_NO_REQUESTS = InferStatistics()   # what a model loaded as files only has done


def ready_model(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The READY model (version) a request names, runner or not (its files
    are served either way), or the error that says why not."""
    check_model_ref(name, version)
    model = service.models.get(name)
    if model is None or model.digest is None:
        raise NotFound(f"{triton_unknown_model(name)}: model {name!r} is not loaded; load it first "
                       f"(POST /v2/repository/models/{name}/load)", subject=name)
    if version is not None and version != model.digest:
        raise NotFound(f"{triton_unknown_model(name, version)}: the loaded version is {model.digest}",
                       subject=version)
    if model.state != "READY":
        raise InvalidInput(f"model {name!r} is not ready ({model.state.lower()}: {model.reason})", subject=name)
    return model


def serving_model(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The loaded model an infer request is for: READY, with runners."""
    model = ready_model(service, name, version)
    if model.runners is None:
        runner = model.carton.runner.runner_name if model.carton else "?"
        raise InvalidInput(f"model {name!r} is loaded as files only, so it cannot run inference: "
                           f"{no_runner_reason(runner)}", subject=name)
    return model


def serving_or_loadable(service: ModelService, name: str, version: str | None) -> LoadedModel | None:
    """What a door resolves before it reads a request: the serving model,
    or None when it is not loaded and the request may load it on demand
    (serving_on_demand, once the request is read)."""
    try:
        return serving_model(service, name, version)
    except (NotFound, InvalidInput):
        if service.turnover.loads_on_demand(name):
            return None
        raise


async def serving_on_demand(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The serving model, loaded on demand (runners.load_on_demand); a name
    the store does not hold is refused as it is without loading on demand."""
    try:
        await service.turnover.load_on_demand(name)
    except NotFound:
        pass   # serving_model says it in the words of an unknown model
    return serving_model(service, name, version)


async def still_serving(service: ModelService, name: str, version: str | None) -> LoadedModel:
    """The serving model once a request has arrived: the same, another
    version, or, unloaded meanwhile (keep_alive), loaded again on demand."""
    try:
        return serving_model(service, name, version)
    except (NotFound, InvalidInput):
        if not service.turnover.loads_on_demand(name):
            raise
    return await serving_on_demand(service, name, version)


def arena_slot_for(model: LoadedModel | None, length: int) -> ArenaSlot | None:
    """A slot for a big binary request of ``length`` bytes and its outputs
    (as many bytes again) in the model version's own arena, when its
    runners map it and one is free; None otherwise (the request goes over
    the runner's socket, as a dynamically batched model's requests always
    do, and a cached model's, whose answers are bytes the cache can keep).
    The HTTP front and gRPC both take theirs here."""
    runners = getattr(model, "runners", None)
    if length < ARENA_FROM or runners is None or runners.arena is None or not runners.arena_capable \
            or getattr(model, "batcher", None) is not None or getattr(model, "response_cache", False):
        return None
    return runners.arena.take(2 * length + 64)


def config_of(service: ModelService, name: str, version: str | None) -> dict[str, Any]:
    """The model's configuration as Triton's model_configuration extension gives it."""
    model = ready_model(service, name, version)
    devices = model.runners.devices if model.runners is not None else []
    decoupled = model.runners is not None and model.runners.decoupled
    return model_config(name, model.carton, model.config, devices, decoupled)  # type: ignore[arg-type]  # READY: it has its carton


def model_stats(model: LoadedModel) -> dict[str, Any]:
    stats = model.runners.statistics if model.runners is not None else _NO_REQUESTS
    return stats.model_stats(model.name, model.digest or "")


def statistics(service: ModelService, name: str | None, version: str | None) -> dict[str, Any]:
    """Every loaded version's statistics (``name`` None), or one model's."""
    if name is None:
        loaded = [m for _, m in sorted(service.models.items()) if m.digest is not None and m.state == "READY"]
        return statistics_answer([model_stats(m) for m in loaded])
    model = service.models.get(name)
    if model is None or model.digest is None or model.state != "READY":
        raise NotFound(f"{triton_unknown_model(name)}: it is not loaded", subject=name)
    if version is not None and version != model.digest:
        raise NotFound(f"{triton_unknown_model(name, version)}: the loaded version is {model.digest}",
                       subject=version)
    return statistics_answer([model_stats(model)])
