"""``cartonstore adopt PATH``: another tool's model files stored as
cartons without a second copy (Store.adopt)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cartonstore.format.units import format_size

if TYPE_CHECKING:
    from cartonstore.store import Store
    from cartonstore.store.adoption import AdoptResult

    from .output import Output


def cmd_adopt(store: Store, args: argparse.Namespace, out: Output) -> None:
    r = store.adopt(Path(args.source), name=args.name)
    lines = [f"adopted {m.model_name} ({m.files} file(s), {format_size(m.size)}) as "
             f"{m.naming.name if m.naming and m.naming.name else '(no name)'}: {m.digest}" for m in r.models]
    out.emit(r.as_json(), [*lines, summary(r)])


def summary(r: AdoptResult) -> str:
    """How the bytes came in: linked (no copy), already there, or copied."""
    said = [f"{r.files_linked} file(s) hard-linked ({format_size(r.bytes_linked)}, no copy)"]
    if r.files_present:
        said.append(f"{r.files_present} already in the store ({format_size(r.bytes_present)})")
    if r.files_copied:
        said.append(f"{r.files_copied} on another filesystem: {format_size(r.bytes_copied)} copied, "
                    f"{format_size(r.bytes_reflinked)} reflinked")
    return "; ".join(said)
