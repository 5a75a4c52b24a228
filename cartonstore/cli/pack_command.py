"""``cartonstore pack``: a carton file from a carton directory, a model
file (.onnx, .pt) or a python model; and the hint ``add`` gives for a
model file, which pack makes a carton of."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidCarton, InvalidInput, NotFound
from cartonstore.format.units import parse_size

if TYPE_CHECKING:
    from cartonstore.store import Store

    from .output import Output


def cmd_pack(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    import tempfile

    from cartonstore.carton.from_model import MODEL_SUFFIXES, model_file_in, onnx_carton_dir, parse_dims
    from cartonstore.carton.pack import pack_directory

    if (args.directory is None) == (args.python is None):
        raise InvalidInput("pack takes a carton directory or a model file, or --python FILE.py:FUNCTION: one of them")
    source = Path(args.directory) if args.directory is not None else None
    if source is not None and not os.path.lexists(source):
        kind = "file" if source.suffix in MODEL_SUFFIXES else "file or directory"
        raise NotFound(f"no such {kind}: {source}", subject=str(source))
    model = model_file_in(source) if source is not None else None
    _check_pack_flags(args, source, model)
    with tempfile.TemporaryDirectory(prefix="cartonstore-pack-") as work:
        if args.python is not None:
            from cartonstore.carton.from_python import python_carton_dir

            source = python_carton_dir(args.python, Path(work) / "carton", name=args.name,
                                       examples=_named_files("--example", args.example))
        elif model is not None and model.suffix == ".pt":
            from cartonstore.carton.from_torchscript import torchscript_carton_dir

            source = torchscript_carton_dir(model, Path(work) / "carton", name=args.name,
                                            examples=_named_files("--example", args.example))
        elif model is not None:
            source = onnx_carton_dir(model, Path(work) / "carton", name=args.name, dims=parse_dims(args.dim),
                                     self_tests=_named_files("--self-test", args.self_test))
        out.written(pack_directory(source, Path(args.output), compression=args.compression,  # type: ignore[arg-type]  # flags checked
                                   link_prefix=args.link_prefix, link_min_size=parse_size(args.link_min_size)))


def _check_pack_flags(args: argparse.Namespace, source: Path | None, model: Path | None) -> None:
    """Each of pack's model flags applies to one kind of source: refuse one given to another, by name."""
    if source is not None and model is None and (args.name or args.dim or args.self_test or args.example):
        raise InvalidInput("--name, --dim, --self-test and --example make a carton from a model file; "
                           f"{source} is a carton directory (its carton.toml says all that)")
    onnx = model is not None and model.suffix == ".onnx"
    if not onnx and (args.dim or args.self_test):
        raise InvalidInput("--dim and --self-test apply to an .onnx file, whose graph has the shapes; a model run "
                           "on --example records the shapes it had and the run as its self-test")
    if onnx and args.example:
        raise InvalidInput("--example is for a .pt file or --python; an .onnx file's graph says what it takes "
                           "(record a run with --self-test INPUT=FILE.npy)")


def _named_files(flag: str, items: list[str]) -> dict[str, Path]:
    """INPUT=FILE arguments."""
    out = {}
    for item in items:
        input_name, sep, file = item.partition("=")
        if not sep or not input_name or not file:
            raise InvalidInput(f"{flag} {item!r}: expected INPUT=FILE.npy", subject=item)
        out[input_name] = Path(file)
    return out


def model_file_hint(source: str, error: InvalidCarton) -> InvalidInput | None:
    """``add model.onnx``: the file is a model, not a carton; say how to make one."""
    from cartonstore.carton.from_model import MODEL_SUFFIXES

    path = Path(source)
    if path.suffix not in MODEL_SUFFIXES or not path.is_file():
        return None
    return InvalidInput(f"{source} is a model file, not a carton ({error.problem}): make a carton of it with "
                        f"`cartonstore pack {source} -o {path.stem}.carton`, then add that", subject=source)
