"""The daemon's collections, each run in a child process.

Why a child and not a thread: planning a collection over 100,000 blobs is
about a second of pure Python. In a daemon thread it holds the GIL away from
the event loop (leases measured waiting up to 130 ms) and leaves the
daemon's heap grown by the size of the plan (RSS 59 -> 81 MiB, for good).
A child, at a lower CPU priority, shares neither; the store lock orders it
with the daemon like any other process, and killing it is a crash that gc
already survives.

The child speaks one line of JSON on stdout: the report, or the error with
its exit code (errors.CATEGORIES), which the parent turns back into the same
kind of error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from cartonstore.errors import CATEGORIES, CartonStoreError, Unavailable, exit_code_for
from cartonstore.format.units import format_size
from cartonstore.store.gc.plan import GcPolicy, GcReport, eviction_summary
from cartonstore.system.child_stop import stop_child

CHILD_NICENESS = 10  # gc is background work: the daemon's requests come first
STOP_GRACE = 5.0     # seconds a cancelled collection has to end at SIGTERM before SIGKILL


async def collect_in_child(root: Path, policy: GcPolicy, *, niceness: int = CHILD_NICENESS) -> GcReport:
    """Run Store(root).collect(policy) in a child process and return its
    report. Cancelling this stops the child (SIGTERM, then SIGKILL)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, str(root), json.dumps(asdict(policy)), str(niceness),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate()
    except BaseException:
        await _stop(proc)
        raise
    return report_from_child(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    def signal_child(sig: int) -> None:
        if proc.returncode is None:
            proc.send_signal(sig)

    await stop_child(signal_child, asyncio.ensure_future(proc.wait()), STOP_GRACE)


def report_from_child(returncode: int | None, out: str, err: str) -> GcReport:
    """Parse what the child printed (pure: tested on its own)."""
    try:
        message = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except ValueError:
        message = None
    if returncode == 0 and isinstance(message, dict) and "report" in message:
        fields = {k: v for k, v in message["report"].items() if k != "freed_bytes"}
        return GcReport(**fields)
    if isinstance(message, dict) and "error" in message:
        # The most general class of the code: 5 is IntegrityError, not its
        # ManifestMismatch (whose constructor takes other arguments); 4 is
        # InvalidInput, not TooLarge.
        same = [c for c, code, _ in CATEGORIES if code == returncode]
        cls = next((c for c in same if not any(c is not o and issubclass(c, o) for o in same)), CartonStoreError)
        raise cls(f"gc: {message['error']}", subject=message.get("subject"))
    how = f"was killed by signal {-returncode}" if returncode and returncode < 0 else f"exited {returncode}"
    tail = err.strip().splitlines()[-1] if err.strip() else "no output"
    raise Unavailable(f"gc process {how}: {tail}")


def child_main(argv: Sequence[str]) -> int:
    root, policy_json, niceness = argv
    try:
        os.nice(int(niceness))
    except OSError:
        pass  # a sandbox that forbids it only costs the daemon some CPU share
    from cartonstore.store import Store

    try:
        with Store(Path(root)) as store:
            report = store.collect(GcPolicy(**json.loads(policy_json)))
    except CartonStoreError as e:
        print(json.dumps({"error": str(e), "subject": e.subject}))
        return exit_code_for(e)
    print(json.dumps({"report": report.as_dict()}))
    return 0


def gc_summary(report: GcReport) -> str:
    """One line for the daemon's log: what a collection freed, and why."""
    return (f"freed {format_size(report.freed_bytes)}: {report.unreferenced_blobs} unreferenced blob(s), "
            f"{eviction_summary(report.as_dict())}, {report.tmp_entries} tmp/ leftover(s), "
            f"{report.expired_leases} expired lease(s); "
            f"store {format_size(report.store_bytes_before)} -> {format_size(report.store_bytes_after)}")


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
