"""[runners]: how the daemon runs loaded models (read by cartonstore.config).

    [runners]
    devices = ["cpu"]              # or ["cuda:0", "cuda:1"]
    ready_timeout = "120s"
    [runners.my_runner]            # a carton's runner_name -> a command
    command = ["/opt/my/bin/serve", "--model", "{model_dir}", "--socket", "{socket}"]
    env = { OMP_NUM_THREADS = "4" }
    framework_version = "2.1.0"

A [runners.<name>] table replaces the built-in runner of that name. Its
command is an argv template (placeholders: config/runner_command.py); the
framework version is what `required_framework_version` is checked against.
[runners.network] is not a runner: ``allow = ["model-name", ...]`` names the
models whose runners keep the network (the operator's choice, never a
carton's).

Every runner runs in a sandbox (server/runner_processes/sandbox.py): ``sandbox`` picks
the mechanism ("auto": bubblewrap and Landlock, whichever are here; "none":
model code runs with the daemon's rights), ``user`` the unprivileged user it
runs as when the daemon is root (where the default "cartonstore-runner" does
not exist, or for "", a transient uid of the daemon's own), ``memory_limit``
and ``max_processes`` its limits (a cgroup where the daemon may make one,
rlimits otherwise) and
``sandbox_paths`` what else it may read (a custom runner's own files).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cartonstore.errors import InvalidInput

from . import values as v

_DEVICE = re.compile(r"cpu|cuda:\d+")
RUNNER_TABLES = frozenset({"network"})   # [runners.<name>] tables that are settings, not runner commands
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?|[0-9]+")
_RUNNER_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class RunnerCommand:
    """One [runners.<name>] table."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    framework_version: str | None = None  # None: no version to check requirements against


def _devices(value: object) -> tuple[str, ...]:
    items = tuple(value.split(",")) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidInput(f"expected a list of devices like [\"cpu\"] or [\"cuda:0\"], got {value!r}")
    for device in items:
        if not isinstance(device, str) or not _DEVICE.fullmatch(device.strip()):
            raise InvalidInput(f"unknown device {device!r}: devices are 'cpu' or 'cuda:N'")
    return tuple(d.strip() for d in items)


def parse_commands(value: object) -> Mapping[str, RunnerCommand]:
    """The [runners.<name>] tables, each checked, keyed by runner name."""
    if not isinstance(value, Mapping):
        raise InvalidInput(f"expected [runners.<name>] tables, got {value!r}")
    return MappingProxyType({name: _command(name, table) for name, table in value.items()})


def _command(name: str, table: object) -> RunnerCommand:
    where = f"[runners.{name}]"
    if not _RUNNER_NAME.fullmatch(name):
        raise InvalidInput(f"{where}: a runner name uses letters, digits, '_', '-' and '.'")
    if isinstance(table, RunnerCommand):
        return table
    if not isinstance(table, Mapping):
        raise InvalidInput(f"{where}: expected a table with 'command', got {table!r}")
    unknown = set(table) - {"command", "env", "framework_version"}
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                           "(known: command, env, framework_version)")
    command = table.get("command")
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidInput(f"{where}: 'command' must be a non-empty list of strings (an argv template)")
    try:
        # The daemon's own check, imported here only when a table needs it:
        # every CLI call reads the config, and the server package is not small.
        from .runner_command import template_placeholders

        template_placeholders(list(command))
    except InvalidInput as e:
        raise InvalidInput(f"{where}: {e}") from None
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidInput(f"{where}: 'env' must be a table of strings")
    version = table.get("framework_version")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise InvalidInput(f"{where}: 'framework_version' must be a version string like '1.16.3'")
    return RunnerCommand(tuple(command), MappingProxyType(dict(env)), version)


# the built-in runners (runner.builtin.BUILTIN_RUNNERS, not imported: it reads package metadata; a test compares)
PREWARM_KINDS = ("python", "onnx", "torchscript")


def _prewarm(value: object) -> tuple[str, ...]:
    kinds = v.strings()(value)
    for kind in kinds:
        if kind not in PREWARM_KINDS:
            raise v.BadValue(f"{kind!r} is not a built-in runner; only {', '.join(PREWARM_KINDS)} can be pre-warmed")
    return tuple(dict.fromkeys(kinds))


def _user(value: object) -> str:
    if isinstance(value, str) and (value == "" or _USER.fullmatch(value)):
        return value
    raise v.BadValue(f"expected a user name or number, or \"\" for a transient uid, got {value!r}")


def _network(value: object) -> frozenset[str]:
    if not isinstance(value, Mapping) or set(value) - {"allow"}:
        raise v.BadValue(f'expected a table [runners.network] with allow = ["model-name", ...], got {value!r}')
    return frozenset(v.strings()(value.get("allow", [])))


FOREVER = math.inf   # keep_alive -1: never unloaded for being idle, nor to make room


def keep_alive(value: object) -> float | None:
    """How long a model stays loaded with no request, as Ollama reads its
    keep_alive: a number of seconds or a duration ("5m", "30s", "1h30m"),
    0 (unload once its requests are answered), a negative one ("-1", "-1m")
    for forever (FOREVER). "": unset (None): never unloaded for being idle,
    but a load past max_loaded may unload it."""
    if value == "":
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    negative = value.strip().startswith("-") if isinstance(value, str) else number and value < 0  # type: ignore[operator]  # a number
    magnitude = (value.strip()[1:] if isinstance(value, str) else -value) if negative else value  # type: ignore[operator]  # a number
    try:
        seconds: float = v.duration(positive=False)(magnitude)
    except v.BadValue:
        raise v.BadValue(f"expected a keep_alive such as 5m, 30s, 0 (unload once answered) or -1 (forever), "
                         f"got {value!r}") from None
    return FOREVER if negative and seconds else seconds


def show_keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return "-1" if seconds == FOREVER else v.duration_text(seconds)


def _show_network(names: frozenset[str]) -> dict[str, list[str]]:
    return {"allow": sorted(names)}


def _paths(value: object) -> tuple[str, ...]:
    paths: tuple[str, ...] = v.strings()(value)
    if not all(p.startswith("/") for p in paths):
        raise v.BadValue(f"expected absolute paths, got {list(paths)!r}")
    return paths


def _percent(value: object) -> float:
    share = v.tolerance(value)
    if share > 100:
        raise v.BadValue(f"expected a percentage in [0, 100], got {value!r}")
    return share


def _show_commands(commands: Mapping[str, RunnerCommand]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, c in commands.items():
        out[name] = {"command": list(c.command), "env": dict(c.env)}
        if c.framework_version is not None:
            out[name]["framework_version"] = c.framework_version
    return out


@dataclass(frozen=True)
class RunnerSettings:
    """[runners]: devices, timeouts and limits of runner processes, and the
    commands that run each Carton runner_name."""

    devices: tuple[str, ...] = v.setting(("cpu",), _devices)
    builtin: bool = v.setting(True, v.boolean)
    ready_timeout: float = v.duration_setting(120.0, positive=True)
    request_timeout: float = v.duration_setting(60.0, positive=True)
    stop_grace: float = v.duration_setting(10.0, positive=False)
    max_restarts: int = v.setting(5, v.integer(0))
    restart_backoff: float = v.duration_setting(0.5, positive=False)
    max_inflight: int = v.setting(64, v.integer(1))
    # How long a request waits for a ready runner while its model's runners restart (it counts against
    # max_inflight meanwhile); past it, 503 naming the wait. 0: refused at once.
    restart_wait: float = v.duration_setting(30.0, positive=False)
    # The most bytes one infer answer may have; unset: the larger of server.max_request_size and what the
    # model's declared outputs can hold. Health and the rest of a runner's answers are held to 64 KiB.
    max_response_size: int | None = v.size_setting(None, 1, optional=True)
    # On by default: a model failing its packager's own tests on this host
    # (a wrong framework build, a damaged weight file that still loads,
    # numerics beyond tolerance) is not one to send traffic to; cartons
    # without [[self_test]] are unaffected.
    selftest_on_load: bool = v.setting(True, v.boolean)
    selftest_rtol: float = v.setting(1e-5, v.tolerance)
    selftest_atol: float = v.setting(1e-8, v.tolerance)
    # A model on a GPU: other kernels, other summation orders, and TF32
    # (onnxruntime's CUDA provider and torch's cuDNN convolutions use it by
    # default) give about 1e-3 relative error against a CPU-recorded answer.
    selftest_rtol_cuda: float = v.setting(1e-3, v.tolerance)
    selftest_atol_cuda: float = v.setting(1e-5, v.tolerance)
    commands: Mapping[str, RunnerCommand] = v.setting(None, parse_commands, _show_commands,
                                                     factory=lambda: MappingProxyType({}))
    sandbox: str = v.setting("auto", v.choice("auto", "bwrap", "landlock", "none"))
    user: str = v.setting("cartonstore-runner", _user)       # when the daemon runs as root; "": a transient uid
    memory_limit: int | None = v.size_setting(None, 1 << 20, optional=True)
    max_processes: int = v.setting(512, v.integer(0))        # processes and threads; 0: no limit
    sandbox_paths: tuple[str, ...] = v.setting((), _paths)    # more that runners may read
    # Built-in runner kinds kept started, one spare per device, so that a load
    # pays for its model, not for the interpreter and the framework's import.
    prewarm: tuple[str, ...] = v.setting((), _prewarm)
    # How long a loaded model with no request stays loaded (keep_alive above); a load's own
    # parameters.keep_alive wins. None: until it is unloaded or a load needs its slot.
    keep_alive: float | None = v.setting(None, keep_alive, show_keep_alive)
    # Models with runners loaded at once (0: no limit); a load past it unloads the least recently used
    # idle one first.
    max_loaded: int = v.setting(0, v.integer(0))
    # An infer to a model the store holds but that is not loaded loads it, waiting at most load_wait.
    # Host memory all runners together may hold (models/turnover.py measures it); None: no limit.
    max_memory: int | None = v.size_setting(None, 1 << 20, optional=True)
    load_on_demand: bool = v.setting(False, v.boolean)
    load_wait: float = v.duration_setting(60.0, positive=True)
    # Memory running short unloads the least recently used idle model (models/turnover.py), one a second
    # at most, before the OOM killer picks a process: the host's /proc/pressure/memory "some avg10" at
    # pressure_psi percent or more (0: not watched), or with pressure_cgroups, a runner's cgroup hitting
    # its memory_limit (the kernel reclaiming to keep it under).
    pressure_psi: float = v.setting(0.0, _percent)
    pressure_cgroups: bool = v.setting(False, v.boolean)
    network: frozenset[str] = v.setting(frozenset(), _network, _show_network)

    def __post_init__(self) -> None:
        replaced = [kind for kind in self.prewarm if kind in self.commands]
        if replaced:
            raise InvalidInput(f"runners.prewarm: {', '.join(replaced)} is run by a [runners.{replaced[0]}] command "
                               "here; only the built-in runners can be pre-warmed", subject="runners.prewarm")
        if self.prewarm and not self.builtin:
            raise InvalidInput("runners.prewarm: the built-in runners are off (runners.builtin = false)",
                               subject="runners.prewarm")

    def selftest_tolerances(self, devices: list[str] | tuple[str, ...]) -> tuple[float, float]:
        """(rtol, atol) for a model on ``devices``: the _cuda pair when any is a GPU."""
        if any(d.startswith("cuda") for d in devices):
            return self.selftest_rtol_cuda, self.selftest_atol_cuda
        return self.selftest_rtol, self.selftest_atol
