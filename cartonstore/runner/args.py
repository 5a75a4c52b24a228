"""The standard runner command line (protocol.py's STANDARD_ARGV, as the
daemon fills it), parsed:

    --model-dir DIR --socket PATH --name NAME --version VERSION
    [--opts JSON_OBJECT] [--devices cpu,cuda:0]

Bad arguments exit with status 2 (argparse: EXIT_BAD_ARGUMENTS); a
carton.toml that cannot be read is a LoadError (EXIT_LOAD_FAILED), like any
other reason the model cannot load.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from cartonstore.errors import CartonStoreError
from cartonstore.format.carton_toml import CARTON_TOML, CartonConfig, parse_carton_toml

from .context import LoadError, RunnerContext

_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]*))?")


def _opts_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {type(value).__name__}")
    return value


def _device_list(text: str) -> list[str]:
    devices = [d.strip() for d in text.split(",") if d.strip()]
    for device in devices:
        if not _DEVICE.fullmatch(device):
            raise argparse.ArgumentTypeError(f"device {device!r} is not 'cpu' or 'cuda:N'")
    return devices or ["cpu"]


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Serve one carton model over KServe v2 on a Unix socket.")
    parser.add_argument("--model-dir", required=True, type=Path, help="the unpacked carton directory")
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to listen on")
    parser.add_argument("--name", required=True, help="the model name in v2 URLs")
    parser.add_argument("--version", required=True, help="the model version in v2 URLs")
    parser.add_argument("--opts", type=_opts_object, default={}, help="runner options, a JSON object")
    parser.add_argument("--devices", type=_device_list, default=["cpu"], help="comma-separated: cpu, cuda:N")
    return parser


def read_carton_config(model_dir: Path) -> CartonConfig | None:
    """model_dir/carton.toml parsed, or None when there is none (a runner may
    be pointed at a bare directory)."""
    path = model_dir / CARTON_TOML
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return parse_carton_toml(raw)
    except CartonStoreError as exc:
        raise LoadError(f"{path}: {exc.message}") from None


def parse_runner_args(argv: list[str] | None = None, *, prog: str | None = None) -> RunnerContext:
    """The RunnerContext the command line and model_dir/carton.toml describe.
    --opts is layered over the carton's [runner.opts]."""
    args = _parser(prog).parse_args(argv)
    model_dir: Path = args.model_dir
    if not model_dir.is_dir():
        raise LoadError(f"model directory {model_dir} does not exist or is not a directory")
    config = read_carton_config(model_dir)
    opts: dict[str, Any] = dict(config.runner.opts) if config else {}
    opts.update(args.opts)
    return RunnerContext(
        model_dir=model_dir,
        socket_path=args.socket,
        opts=opts,
        devices=args.devices,
        name=args.name,
        version=args.version,
        inputs=list(config.inputs) if config and config.inputs is not None else None,
        outputs=list(config.outputs) if config and config.outputs is not None else None,
        runner_name=config.runner.runner_name if config else None,
    )
