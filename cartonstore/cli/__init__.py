"""The ``cartonstore`` command, a thin layer over the library: each command
parses its flags (parser.py, args.py), calls one library method and prints
the result (output.py: lines, or JSON with --json).

commands.py: ``main`` and the store commands; daemon_commands.py: serve,
gc, load and unload; pack_command.py: pack; local_infer.py: infer and
selftest without a daemon; inspect.py; progress.py (fetch progress on a
terminal). ``python -m cartonstore.cli``
runs the same command.
"""

from cartonstore.cli.commands import main

__all__ = ["main"]
