"""bench_infer.py section 7: what the runner sandbox costs. Two daemons side
by side, one running runners unsandboxed (sandbox = "none"), one sandboxed
("auto": bubblewrap with Landlock inside, as runners.user when root). The
same echo carton is loaded under fresh names in each, in turn (start-to-READY:
the load request's time, everything else alike), then 16-float binary
requests are sent one at a time to each model, in turn, through its daemon
(the same client). Targets: start-to-READY at most 100 ms slower, infer
p50 within 1.05x.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from http11 import CLIENTS, Address

ROUNDS = 6


def why_not() -> str | None:
    from cartonstore.server.runner_processes.sandbox import unreachable

    if os.geteuid() != 0:
        return None   # runners keep the daemon's uid: nothing more to check
    for name in ("cartonstore-runner", "nobody"):
        try:
            user = pwd.getpwnam(name)
            break
        except KeyError:
            continue
    else:
        return "no unprivileged user to run runners as"
    blocked = unreachable(os.path.realpath(sys.executable), user.pw_uid, user.pw_gid)
    return f"{user.pw_name} cannot execute this Python: {blocked}" if blocked else None


def user_name() -> str:
    for name in ("cartonstore-runner", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    return "nobody"


async def _sequential(address: Address, model: str, body: bytes, headers: dict[str, str], n: int) -> list[float]:
    conn = await CLIENTS["raw"].open(address)
    try:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            status, _, _ = await conn.request("POST", f"/v2/models/{model}/infer", body, headers)
            out.append((time.perf_counter() - t) * 1000)
            assert status == 200, status
        return out
    finally:
        await conn.close()


def run(work: Path, env: dict[str, str], requests: int, payload: tuple[bytes, dict[str, str]],
        load_model: Callable, verdict: Callable) -> None:
    from kit.daemonkit import DaemonProcess
    from kit.inferkit import echo_carton

    print("7. the runner sandbox: start-to-READY and infer p50, unsandboxed vs sandboxed daemons, in turn:")
    if (why := why_not()) is not None:
        print(f"  skipped: {why}\n")
        return
    work.chmod(0o711)   # the runner user passes through to the store, as under a real store root
    config = work / "sandbox.toml"
    config.write_text(f'[runners]\nuser = "{user_name()}"\n')
    daemons = {mode: DaemonProcess(work / f"root-{mode}", listen=None, socket_path=work / f"{mode}.sock",
                                   extra_args=["--config", str(config)], env={**env, "CARTONSTORE_SANDBOX": mode})
               for mode in ("none", "auto")}
    try:
        for d in daemons.values():
            d.start()
            d.root.chmod(0o755)
        source = echo_carton(work / "sandbox-echo", dtypes=["float32"])
        ready: dict[str, list[float]] = {m: [] for m in daemons}
        for i in range(ROUNDS):
            for mode in (("none", "auto") if i % 2 == 0 else ("auto", "none")):
                t = time.perf_counter()
                load_model(daemons[mode].socket_path, f"echo{i}", source)
                ready[mode].append((time.perf_counter() - t) * 1000)
        body, headers = payload
        lat: dict[str, list[float]] = {m: [] for m in daemons}
        for i in range(ROUNDS):
            for mode in (("none", "auto") if i % 2 == 0 else ("auto", "none")):
                lat[mode] += asyncio.run(_sequential(Address(unix=str(daemons[mode].socket_path)), "echo0", body,
                                                     headers, max(requests // ROUNDS, 50)))
        from kit.daemonkit import call

        layers = call(daemons["auto"], "POST", "/v2/repository/index", json={})[1][0]["sandbox"]
        for mode, label in (("none", "unsandboxed"), ("auto", f"sandboxed ({layers})")):
            print(f"  {label:60s} start-to-READY median {statistics.median(ready[mode]):7.1f} ms "
                  f"(min {min(ready[mode]):.1f}), infer p50 {statistics.median(lat[mode]):.3f} ms")
        delta = statistics.median(ready["auto"]) - statistics.median(ready["none"])
        ratio = statistics.median(lat["auto"]) / statistics.median(lat["none"])
        print()
        verdict("7. sandboxed start-to-READY <= unsandboxed + 100 ms", delta <= 100, f"+{delta:.1f} ms")
        verdict("7. sandboxed infer p50 <= 1.05x unsandboxed", ratio <= 1.05, f"{ratio:.3f}x")
    finally:
        for d in daemons.values():
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
