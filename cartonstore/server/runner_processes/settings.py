"""What the runner supervisor works with besides [runners]' settings
(cartonstore.config.runners.RunnerSettings): how to launch one runner
instance, how it restarts one, and what a forwarded request brings back."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cartonstore.errors import InvalidInput, Unavailable
from cartonstore.v2.statistics import RequestTiming

from .sandbox import SandboxPolicy

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"

# Response headers a caller of forward() needs; the rest is the runner's business.
FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Inference-Header-Content-Length", "Content-Encoding")

_DEVICE = re.compile(r"cpu|cuda:(0|[1-9][0-9]*)")

# A runner that died is restarted after runners.restart_backoff, doubled per
# failure in a row up to RESTART_DELAY_MAX; one that stayed ready for
# STABLE_AFTER seconds starts its count of failures again at 0.
RESTART_DELAY_MAX = 30.0
STABLE_AFTER = 30.0
STDERR_LINES = 20   # a runner's last stderr lines, kept to explain a failure


@dataclass(frozen=True)
class InstanceSpec:
    """One runner instance: its command line (placeholders already filled),
    extra environment, the Unix socket it serves on and the device it owns."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    socket_path: Path = Path()
    device: str = "cpu"
    sandbox: SandboxPolicy | None = None   # None: the daemon's own rights (sandbox.py)
    model: str = ""                         # the model's name and directory, what a sandbox lets it see
    model_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise InvalidInput(f"runner command must be a non-empty list of strings, not {self.argv!r}")
        if not _DEVICE.fullmatch(self.device):
            raise InvalidInput(f"runner device {self.device!r} is not 'cpu' or 'cuda:N'")
        if not str(self.socket_path) or str(self.socket_path) == ".":
            raise InvalidInput("runner socket path is empty")
        if self.sandbox is not None and self.model_dir is None:
            raise InvalidInput("a sandboxed runner needs its model directory")

    def cuda_visible_devices(self, inherited: str | None) -> str:
        """CUDA_VISIBLE_DEVICES for this instance: none for cpu, exactly its
        GPU otherwise, as the daemon's own CUDA_VISIBLE_DEVICES (``inherited``)
        numbers them (physical_gpu)."""
        return "" if self.device == "cpu" else physical_gpu(self.device, inherited)


def physical_gpu(device: str, inherited: str | None) -> str:
    """What CUDA_VISIBLE_DEVICES names "cuda:N" as: N's entry in the
    daemon's own CUDA_VISIBLE_DEVICES when it has one (a daemon given
    "2,3" places cuda:0 on GPU 2, as CUDA would number them for it), else N.
    InvalidInput for a GPU the daemon was not given."""
    number = int(device.split(":", 1)[1])
    if inherited is None:
        return str(number)
    given = [entry.strip() for entry in inherited.split(",") if entry.strip()]
    if number >= len(given):
        which = ", ".join(f"cuda:{i} is GPU {g}" for i, g in enumerate(given)) or "no GPU"
        raise InvalidInput(f"{device} is not a GPU this daemon was given: CUDA_VISIBLE_DEVICES is {inherited!r} "
                           f"({which})", subject=device)
    return given[number]


@dataclass
class RunnerResponse:
    """A runner's answer, whatever its status: the caller passes it on."""

    status: int
    headers: dict[str, str]
    body: bytes | bytearray | memoryview
    arena: bool = False   # sent in the arena's form: binary outputs may be in the slot (arena_wire.py)
    timing: RequestTiming | None = None   # where its time went in the runner (None: the runner did not say)


class RunnersBusy(Unavailable):
    """A model already has max_inflight requests in flight or queued.
    The HTTP layer answers 503 with Retry-After: retry_after."""

    def __init__(self, message: str, *, subject: str | None = None, retry_after: int = 1) -> None:
        super().__init__(message, subject=subject)
        self.retry_after = retry_after


class NotSent(Unavailable):
    """A request that never reached its runner (it died, or was restarting,
    before a byte was written to it): the model's pool sends it to the next
    ready runner."""
