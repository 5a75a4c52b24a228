"""`cartonstore infer` with no daemon serving: start the model's runner
here, run one request through it (validated like the daemon does), stop it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Mapping

import numpy as np

from .config import Config
from .errors import CartonStoreError
from .fetch.puller import Puller
from .store import Store
from .v2.framing import HEADER_LENGTH, encode_infer_request, parse_infer_request, parse_infer_response
from .v2.validate import validate_request


def infer_locally(store: Store, settings: Config, ref: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return asyncio.run(_infer(store, settings, ref, inputs))


async def _infer(store: Store, settings: Config, ref: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from .server.model_runtime import RunnerHost, files_only_note

    async with Puller(store, settings.fetch_config()) as puller:
        model_dir = await puller.materialize(ref)
    cfg = await asyncio.to_thread(store.config_of, model_dir.name)
    parts, header_length = encode_infer_request(inputs, binary=True, binary_outputs=True)
    body = b"".join(parts)
    validate_request(parse_infer_request(body, header_length), cfg.inputs, cfg.outputs)
    host = RunnerHost(settings.runners, store.layout.root / "run" / "runners")
    host.prepare()
    name = f"cli-{os.getpid()}"
    runners = await host.start(name, model_dir.name, model_dir, cfg, None)
    if runners is None:
        raise CartonStoreError(files_only_note(cfg.runner.runner_name), subject=ref)
    try:
        answer = await runners.forward(f"/v2/models/{name}/infer", [body],
                                       {"Content-Type": "application/octet-stream",
                                        HEADER_LENGTH: str(header_length)})
    finally:
        await host.stop(runners)
    if answer.status != 200:
        raise CartonStoreError(f"the runner answered {answer.status}: {answer.body[:500].decode('utf-8', 'replace')}",
                               subject=ref)
    length = {k.lower(): v for k, v in answer.headers.items()}.get(HEADER_LENGTH.lower())
    return parse_infer_response(answer.body, int(length) if length is not None else None)[1]
