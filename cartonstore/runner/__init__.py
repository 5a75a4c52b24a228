"""The runner SDK: serve a model over KServe v2 REST on a Unix socket, as
one supervised process of the cartonstore daemon.

A runner is a program that the daemon starts with the standard arguments
(``--model-dir DIR --socket PATH --name NAME --version VERSION [--opts JSON]
[--devices cpu,cuda:0]``). ``main`` parses them, loads the model, answers
``/v2`` health, metadata, statistics and infer requests (Triton's binary
tensor data extension included) until SIGTERM, finishes what is in flight
and exits 0. A model that cannot load makes it exit with status 3 and the
reason as its last stderr line. A whole runner::

    from cartonstore.runner import main

    class Doubler:
        def infer(self, inputs, parameters):
            return {"y": inputs["x"] * 2}

    main(lambda ctx: Doubler())

``inputs`` maps input names to numpy arrays (BYTES as object arrays of
bytes); ``infer`` returns arrays by output name (str or bytes arrays go back
as BYTES), or an ``InferResult`` to add response parameters. It runs in
the server's thread for the connection that brought the request (the
daemon keeps one per request it has in flight), one call at a time unless
[runner.opts] max_concurrency allows more. ``ctx`` (a RunnerContext) carries the model directory, the
options, the devices and the carton's declared inputs and outputs; raise
``LoadError`` from the loader to refuse a model with a clear reason.

Built-in runners: ``python -m cartonstore.runner.backends.python`` (Carton's python
runner), ``cartonstore.runner.backends.onnx`` (onnxruntime) and
``cartonstore.runner.backends.torchscript`` (torch.jit).

What the daemon and a runner say to each other (argv, environment,
inherited fds, routes, framing, keep-alive, exit statuses, the arena) is
``cartonstore.runner.protocol``: the page to read for a runner of one's
own that is not built on this SDK. Importing it loads none of the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {"context": "InferResult LoadError Model RunnerContext",
                                                      "serving": "main serve"})

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .context import InferResult, LoadError, Model, RunnerContext
    from .serving import main, serve
