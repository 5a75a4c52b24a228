"""The ``cartonstore`` command line: its commands, their options and help.

build_parser(handlers) gives the whole parser (help, completion, tests);
build_parser(handlers, only="path") gives the main parser with that one
command, which is all a run of that command needs. argparse builds a parser
per command and checks every option as it is added, which for thirteen
commands costs more than `cartonstore path` itself does (it must
answer in about 100 ms, interpreter start included).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cartonstore import __version__

from .progress import MODES

EPILOG = """\
examples:
  cartonstore add ./resnet.carton --name resnet
  cartonstore path resnet                 # prints the model directory
  cartonstore inspect f1cae514 --json
  cartonstore pack ./my-model -o my-model.carton --compression zstd
  cartonstore pack model.pt --example x=x.npy -o model.carton
  cartonstore export resnet -o copy.carton
  cartonstore verify --repair

REF is a manifest hash, a unique prefix of at least 8 hex digits, a name,
or (for path and inspect) a local .carton file or directory to add first.
The store root is --root, else $CARTONSTORE_ROOT, else $XDG_CACHE_HOME/cartonstore,
else /var/lib/cartonstore for root and ~/.cache/cartonstore for other users.
A command's options may also come before it: cartonstore --root DIR ls.
Exit status: 0 ok, 2 usage, 3 not found, 4 invalid input, 5 integrity
failure, 6 unavailable (disk, lock, network, no daemon), 7 conflict,
8 a failed self-test, 9 permission denied, 1 other errors.
"""

SOCKET_DEFAULT = ("$CARTONSTORE_SOCKET, else /run/cartonstore/cartonstore.sock for the store /var/lib/cartonstore, "
                  "else ROOT/cartonstore.sock")
SOCKET_HELP = f"the daemon's socket (default: {SOCKET_DEFAULT})"


def terminal_columns() -> int:
    """As shutil.get_terminal_size finds it (COLUMNS if a positive number,
    else the terminal's, else 80), without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
        if columns > 0:
            return columns
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]  # None: AttributeError, caught
    except (AttributeError, ValueError, OSError):
        return 80


# -- each command's options ----------------------------------------------------------

def _add(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("source", help="a .carton file, an unpacked carton directory, an http(s) URL, an OCI "
                    "artifact: oci://HOST[:PORT]/REPO:TAG or oci://HOST/REPO@sha256:..., or a Hugging Face "
                    "repository: hf://ORG/NAME[@REVISION]")
    sp.add_argument("--name", help="name to refer to the carton by (default: its model_name, when no other "
                    "carton has that name); moves the name from another carton, and says so")
    sp.add_argument("--force", action="store_true",
                    help="move --name even from a model the daemon has loaded (its leases stay valid)")
    sp.add_argument("--lazy", action="store_true",
                    help="only make the carton known; fetch LINKS blobs (an OCI artifact's raw layers, an hf:// "
                    "repository's files) later, on path")
    sp.add_argument("--include", action="append", default=[], metavar="GLOB",
                    help="hf:// only: add the files matching GLOB (fnmatch, as huggingface_hub's allow_patterns; "
                    "'dir/' is the whole folder); repeat for more (default: every file)")
    sp.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                    help="hf:// only: leave out the files matching GLOB (as ignore_patterns); repeat for more")


def _adopt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("source", metavar="PATH", help="a Hugging Face cache repository (~/.cache/huggingface/hub/"
                    "models--ORG--NAME), an Ollama models directory (~/.ollama/models) or a directory of model files")
    sp.add_argument("--name", help="name to refer to the carton by (default: ORG-NAME, name-tag or the directory's "
                    "name, when no other carton has it); only where PATH holds one model")


def _ref(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ref")


UNLOAD_AFTER_HELP = ("unload the model from the daemon afterwards if this command loaded it (by default it stays "
                     "loaded, and the command says so)")


def _infer(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ref", help="the model's name (or, with no daemon, any REF)")
    sp.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy|JSON",
                    help="an input tensor: a .npy file, or JSON data typed by the model's declared dtype")
    sp.add_argument("--socket", help=SOCKET_HELP)
    sp.add_argument("--unload-after", action="store_true", help=UNLOAD_AFTER_HELP)


def _csi(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--endpoint", required=True, help="where the kubelet calls the plugin: unix:///PATH")
    sp.add_argument("--socket", help=SOCKET_HELP)
    sp.add_argument("--node-id", help="the node's id in NodeGetInfo (default: the host name)")


def _selftest(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ref", help="the model's name (or, with no daemon, any REF)")
    sp.add_argument("--rtol", type=float,
                    help="relative tolerance (default: runners.selftest_rtol; selftest_rtol_cuda on a GPU)")
    sp.add_argument("--atol", type=float,
                    help="absolute tolerance (default: runners.selftest_atol; selftest_atol_cuda on a GPU)")
    sp.add_argument("--socket", help=SOCKET_HELP)
    sp.add_argument("--unload-after", action="store_true", help=UNLOAD_AFTER_HELP)


# oci.push.PUSH_FORMATS (a test holds them equal): importing it here would
# load the fetch stack for every --help.
PUSH_FORMATS = ("carton", "modelpack")


def _push(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ref", help="the carton: a name, a manifest hash or a unique prefix of one")
    sp.add_argument("target", help="where to push it: oci://HOST[:PORT]/REPO:TAG")
    sp.add_argument("--format", choices=PUSH_FORMATS, default="carton",
                    help="the artifact written: a carton (default), or a CNCF ModelPack that modctl and KitOps read")


# zipfmt.COMPRESSION_METHODS's names (a test holds them equal): importing the
# writer here would load zstandard for every --help.
COMPRESSION_NAMES = ("zstd", "deflate", "stored")


def _archive(sp: argparse.ArgumentParser) -> None:
    """What export and pack both write: a carton file, compressed."""
    sp.add_argument("-o", "--output", required=True)
    sp.add_argument("--compression", choices=COMPRESSION_NAMES, default="zstd")


def _export(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ref")
    _archive(sp)
    sp.add_argument("--links", metavar="URL_PREFIX",
                    help="leave files out of the zip and list them in LINKS as URL_PREFIX/<sha256>")
    sp.add_argument("--link-min-size", default="0", metavar="SIZE",
                    help="with --links, link only files at least this big (e.g. 1M)")


def _pack(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("directory", nargs="?",
                    help="a carton directory, or a model file (model.onnx, model.pt) or a directory holding one")
    _archive(sp)
    sp.add_argument("--name", help="from a model file: the carton's model_name (default: the file's name)")
    sp.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE|NEW_SYMBOL",
                    help="from an .onnx file: fix or rename a dimension the graph names (batch=8, N=batch)")
    sp.add_argument("--self-test", action="append", default=[], metavar="INPUT=FILE.npy",
                    help="from an .onnx file: run the model once on these inputs and record it as a self-test")
    sp.add_argument("--python", metavar="FILE.py:FUNCTION",
                    help="a python model: FUNCTION() returns it; its directory becomes the carton's model/")
    sp.add_argument("--example", action="append", default=[], metavar="INPUT=FILE.npy",
                    help="with a .pt file or --python: the inputs it is run on once, to record what it takes and "
                         "returns")
    sp.add_argument("--link-prefix", metavar="URL", help="URL prefix for files listed in LINKS")
    sp.add_argument("--link-min-size", default="0", metavar="SIZE", help="files at least this big go to LINKS")


def _serve(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--print-config", action="store_true", help="print the settings in effect (TOML) and exit")
    sp.add_argument("--socket", help=f"Unix socket path (default: {SOCKET_DEFAULT})")
    sp.add_argument("--listen", metavar="HOST:PORT", help="also serve on a loopback TCP port (0: any free port)")
    sp.add_argument("--grpc-listen", metavar="HOST:PORT",
                    help="also serve gRPC on a loopback TCP port (0: any free port)")
    sp.add_argument("--mirror-listen", metavar="HOST:PORT",
                    help="serve a pull-through OCI registry mirror of the store on this port (mirror.listen)")
    sp.add_argument("--no-restore", action="store_true",
                    help="do not load again the models this daemon had loaded (server.restore_loaded)")
    sp.add_argument("--log-format", choices=["text", "json"])
    sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"])


def _gc(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--max-size", metavar="SIZE", help="evict LRU models until blobs fit in SIZE")
    sp.add_argument("--min-free", metavar="SIZE", help="evict LRU models until SIZE is free on the disk")
    sp.add_argument("--grace", metavar="DURATION", help="keep unreferenced blobs younger than this (default 1h)")
    sp.add_argument("--dry-run", action="store_true", help="only report what would be freed")
    sp.add_argument("--forget-unrecoverable", action="store_true",
                    help="remove whole (as rm) the models whose blobs have no source to fetch them again, "
                         "instead of keeping those blobs")
    sp.add_argument("--local", action="store_true", help="run here even when a daemon serves the store")
    sp.add_argument("--socket", help=SOCKET_HELP)


def _load(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("name", help="the model's name (or manifest hash) in the store")
    sp.add_argument("--config", dest="model_config", metavar="JSON",
                    help="Triton's model config for this load, a JSON object (max_batch_size, instance_group, "
                         "dynamic_batching, parameters); the settings file is then $CARTONSTORE_CONFIG")
    sp.add_argument("--wait", action="store_true",
                    help="wait up to 2 minutes for a daemon that is starting (its socket not there yet, or "
                         "still loading again what it had loaded)")
    sp.add_argument("--socket", help=SOCKET_HELP)
    sp.set_defaults(config=None)


def _unload(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("name", help="the model's name")
    sp.add_argument("--socket", help=SOCKET_HELP)


def _verify(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--repair", action="store_true",
                    help="quarantine corrupt blobs and rebuild damaged model directories")


def _ls(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--sources", action="store_true",
                    help="instead of the cartons: per kind of source (url, oci, hf, peer, mirror, adopted), the "
                         "bytes and blobs fetched into the store and those not fetched because it had them")


# name: (help, example, takes the fetching options, adds its own options)
COMMANDS: dict[str, tuple[str, str, bool, Callable[[argparse.ArgumentParser], None]]] = {
    "add": ("add a carton (file, directory or URL); prints its manifest hash",
            "cartonstore add https://models.example.com/resnet.carton --name resnet", True, _add),
    "adopt": ("store a Hugging Face cache repository, an Ollama models directory or a directory of model files "
              "as cartons, hard-linking each verified file instead of copying it",
              "cartonstore adopt ~/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B", False, _adopt),
    "path": ("materialize a carton, fetching what is missing; prints its model directory",
             "cartonstore path my-model", True, _ref),
    "infer": ("run one inference request through the daemon (loading the model if needed; with no daemon "
              "serving, the model's runner is started here) and print the outputs",
              "cartonstore infer resnet --input x=image.npy --input k='[1, 2, 3]' --json", False, _infer),
    "selftest": ("run a carton's [[self_test]]s through its runner (in the daemon, loading the model if needed; "
                 "with no daemon serving, a runner started here); exit 8 if one fails",
                 "cartonstore selftest resnet --rtol 1e-4 --json", False, _selftest),
    "ls": ("list the cartons in the store", "cartonstore ls --json", False, _ls),
    "inspect": ("show a carton's metadata, files and tensors", "cartonstore inspect my-model", False, _ref),
    "push": ("push a carton to an OCI registry as an artifact; prints its reference with the manifest digest",
             "cartonstore push resnet oci://registry.example.com/models/resnet:v1", True, _push),
    "export": ("write a carton from the store to a .carton file", "cartonstore export my-model -o my-model.carton",
               False, _export),
    "pack": ("pack a carton directory, or make a carton of a model file (.onnx, .pt) or a python model",
             "cartonstore pack ./my-model -o my-model.carton --link-prefix https://cdn/x --link-min-size 64M",
             False, _pack),
    "rm": ("remove a carton, its model directory and blobs no other carton uses", "cartonstore rm my-model",
           False, _ref),
    "serve": ("run the daemon: the KServe v2 / Triton API and leases on a Unix socket",
              "cartonstore serve --listen 127.0.0.1:8000", False, _serve),
    "csi": ("run the CSI node plugin: pods mount models as read-only inline volumes, leased through the daemon",
            "cartonstore csi --endpoint unix:///csi/csi.sock --socket /run/cartonstore/cartonstore.sock",
            False, _csi),
    "gc": ("collect garbage: expired leases, unreferenced blobs, tmp/ leftovers, and least recently used "
           "models over the budget", "cartonstore gc --max-size 200G --dry-run", False, _gc),
    "verify": ("rehash every blob and check model directories against MANIFEST", "cartonstore verify --repair",
               False, _verify),
    "load": ("load a model into the daemon and wait until it is ready (or say why it failed); prints its "
             "manifest hash", """cartonstore load resnet --config '{"max_batch_size": 8}'""", False, _load),
    "unload": ("unload a model from the daemon: its runners stop, its files stay in the store",
               "cartonstore unload resnet", False, _unload),
}
MODEL_CONFIG_COMMANDS = {"load"}
"""Commands whose --config is Triton's model config (JSON), as the load API
names it, not the settings file; theirs is $CARTONSTORE_CONFIG."""


def build_parser(handlers: Mapping[str, Callable[..., Any]], *, only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``only=None``) or of one; each command's
    handler is set as ``func``."""
    if only is not None and only not in COMMANDS:
        raise ValueError(f"no command {only!r}")
    # The width found once: argparse makes a formatter for every add_argument
    # (to check its metavar), and `path` must start fast.
    formatter = functools.partial(argparse.RawDescriptionHelpFormatter, width=terminal_columns() - 2)
    common = argparse.ArgumentParser(add_help=False, formatter_class=formatter)
    common.add_argument("--root", type=Path, default=None,
                        help="store root (default: $CARTONSTORE_ROOT, else $XDG_CACHE_HOME/cartonstore, else "
                             "/var/lib/cartonstore as root, ~/.cache/cartonstore as another user)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    settings_file = argparse.ArgumentParser(add_help=False, formatter_class=formatter)
    settings_file.add_argument("--config", type=Path, default=None,
                               help="TOML settings file (default: $CARTONSTORE_CONFIG; see config/cartonstore.toml)")

    p = argparse.ArgumentParser(prog="cartonstore", description="A shared, content-addressed store "
                                "of ML models packaged as cartons.", epilog=EPILOG, formatter_class=formatter)
    p.add_argument("--version", action="version", version=f"cartonstore {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fetching: argparse.ArgumentParser | None = None
    for name, (help, example, fetches, add_options) in COMMANDS.items():
        if only is not None and name != only:
            continue
        parents = [common] if name in MODEL_CONFIG_COMMANDS else [common, settings_file]
        if fetches:
            fetching = fetching or _fetching_options(formatter)
            parents.append(fetching)
        sp = sub.add_parser(name, parents=parents, help=help, description=help, epilog=f"example:\n  {example}",
                            formatter_class=formatter)
        sp.set_defaults(func=handlers[name])
        add_options(sp)
    return p


def _fetching_options(formatter: Callable[..., argparse.HelpFormatter]) -> argparse.ArgumentParser:
    fetching = argparse.ArgumentParser(add_help=False, formatter_class=formatter)
    fetching.add_argument("--mirror", action="append", metavar="URL",
                          help="also fetch blobs from URL/<sha256> (repeatable)")
    fetching.add_argument("--allow-host", action="append", metavar="HOST",
                          help="fetch only from these hosts (repeatable; *.example.com, 10.0.0.0/8)")
    fetching.add_argument("--deny-host", action="append", metavar="HOST", help="never fetch from these hosts")
    fetching.add_argument("--progress", choices=MODES, default="auto",
                          help="auto: a bar on a terminal, plain lines otherwise; json: JSON lines on stderr")
    return fetching
