"""Where options may go on the ``cartonstore`` command line.

- A command's options may come before the command as well as after it:
  ``cartonstore --root DIR ls`` is ``cartonstore ls --root DIR``. argparse
  alone cannot do this (a subcommand's defaults overwrite what the main
  parser read before it), so argv is rearranged first: options before the
  command move right after it, where the command's own parser judges them.
  An option the command does not take stays an error naming it, wherever it
  was written.
- A value that starts with ``-`` and a digit (``gc --max-size -5G``) is the
  option's value, not another option: it is passed as ``--max-size=-5G`` so
  the command can say what is wrong with it ("a size must be positive")
  instead of argparse's "expected one argument".
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

_NEGATIVE = re.compile(r"-\.?\d")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - argparse keeps subparsers nowhere public
            return dict(action.choices)
    return {}


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def arrange_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """argv with the options written before the command moved after it, and
    negative-looking values joined to their options (see the module doc).
    The first word that is no option's value is taken as the command."""
    argv = list(argv)
    commands = _commands(parser)
    known = {opt: action for sp in commands.values() for opt, action in sp._option_string_actions.items()}  # noqa: SLF001 - argparse's table of options, nowhere public
    before: list[str] = []
    stay: list[str] = []  # the main parser's own (-h, --version) and unknown options
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):  # the command: argparse names the commands if it is none of them
            sp = commands.get(token)
            rest = before + argv[i + 1:]
            return stay + [token] + (_join_negative(rest, sp) if sp is not None else rest)
        if token == "--":
            return argv
        name = token.split("=", 1)[0]
        action = known.get(name) or _abbreviated(name, known)
        if action is None or name in parser._option_string_actions:  # noqa: SLF001 - argparse's table of options, nowhere public
            stay.append(token)
            i += 1
        elif _takes_value(action) and "=" not in token and i + 1 < len(argv):
            before += argv[i:i + 2]
            i += 2
        else:
            before.append(token)
            i += 1
    return stay + before  # no command: -h and --version still work, argparse says the rest


def _abbreviated(prefix: str, known: dict[str, argparse.Action]) -> argparse.Action | None:
    """The option a unique prefix stands for (--ro: --root), as argparse allows after the command."""
    options = {opt for opt in known if prefix.startswith("--") and opt.startswith(prefix)}
    return known[options.pop()] if len(options) == 1 else None


def _join_negative(args: list[str], sp: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return out + args[i:]
        action = sp._option_string_actions.get(token)  # noqa: SLF001 - argparse's table of options, nowhere public
        if action is not None and _takes_value(action) and i + 1 < len(args) and _NEGATIVE.match(args[i + 1]):
            out.append(f"{token}={args[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out
