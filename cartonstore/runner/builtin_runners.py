"""The runners that ship with cartonstore, as the daemon sees them: the
command that starts each, and the framework version each provides (checked
against a carton's required_framework_version before anything starts).

The version probes read package metadata only: importing torch or
onnxruntime in the daemon would cost seconds and hundreds of MiB.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from importlib import metadata

from .protocol import STANDARD_ARGV


def program(kind: str) -> list[str]:
    """What runs the built-in runner ``kind``, before its arguments."""
    return [sys.executable, "-m", f"cartonstore.runner.backends.{kind}"]


# Carton runner_name -> argv template ({placeholders} filled by the daemon).
BUILTIN_RUNNERS: dict[str, list[str]] = {kind: [*program(kind), *STANDARD_ARGV]
                                         for kind in ("python", "onnx", "torchscript")}


def _package_version(distribution: str) -> Callable[[], str]:
    def probe() -> str:
        # PackageNotFoundError propagates: the daemon reports the runner as
        # unusable here, naming the missing package.
        return metadata.version(distribution)

    probe.__name__ = f"{distribution}_version"
    return probe


# Carton runner_name -> a function returning the framework version that
# runner provides (raises when the framework is not installed).
FRAMEWORK_VERSION_PROBES: dict[str, Callable[[], str]] = {
    "python": platform.python_version,
    "onnx": _package_version("onnxruntime"),
    "torchscript": _package_version("torch"),
}


# Triton's names (model_config.proto's platform and backend) for what the
# built-in runners run; any other runner's are carton_<runner_name>.
_TRITON_PLATFORMS: dict[str, tuple[str, str]] = {
    "onnx": ("onnxruntime_onnx", "onnxruntime"),
    "torchscript": ("pytorch_libtorch", "pytorch"),
    "python": ("", "python"),
}


def triton_platform(runner_name: str) -> tuple[str, str]:
    """(platform, backend) of a model config, as Triton names them."""
    return _TRITON_PLATFORMS.get(runner_name, (f"carton_{runner_name}", f"carton_{runner_name}"))


def metadata_platform(runner_name: str) -> str:
    """A model metadata's "platform", as Triton answers it: the config's
    platform, else its backend (a python model's is "python")."""
    platform, backend = triton_platform(runner_name)
    return platform or backend
