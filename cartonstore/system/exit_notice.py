"""Child processes whose exit is noticed at once, pipes or no pipes."""

from __future__ import annotations

import asyncio


class ExitNoticingProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's own protocol, plus a future set the moment the process
    exits. (Process.wait() also waits for the pipes to close, which a helper
    the runner forked can put off indefinitely.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 2 ** 16) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exit_seen: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit_seen.done():
            self.exit_seen.set_result(None)
