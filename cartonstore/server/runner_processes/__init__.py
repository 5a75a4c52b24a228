"""The daemon's side of model runners: start one supervised process per
instance of a loaded model, keep it alive, and forward requests to it over
its Unix socket, as cartonstore.runner.protocol says.

    runners = ModelRunners(name, version, [InstanceSpec(argv, env, socket, "cpu")], config.runners)
    await runners.start()          # InvalidInput if a runner does not come up
    resp = await runners.forward(infer_path(name), body_parts, headers)
    await runners.stop()
"""

from __future__ import annotations

from cartonstore.config.runner_command import fill_argv, template_placeholders
from cartonstore.runner.protocol import PLACEHOLDERS

from .pool import ModelRunners
from .settings import LOADING, READY, UNAVAILABLE, InstanceSpec, RunnerResponse, RunnersBusy
from .sockets import clean_stale_sockets, daemon_run_dir, ensure_run_dir, instance_socket_path

__all__ = [
    "LOADING", "PLACEHOLDERS", "READY", "UNAVAILABLE", "InstanceSpec", "ModelRunners", "RunnerResponse",
    "RunnersBusy", "clean_stale_sockets", "daemon_run_dir", "ensure_run_dir", "fill_argv",
    "instance_socket_path", "template_placeholders",
]
