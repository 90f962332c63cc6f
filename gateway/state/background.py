"""One background task that runs a step against the store every interval (`StateStore.repeat`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gateway.state.store import StateStore


class Repeating:
    def __init__(self, store: StateStore, part: str, step: Callable[[], Awaitable[object]], interval_s: float) -> None:
        self.store = store
        self.part = part
        self.step = step
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.store.repeat(self.part, self.step, self.interval_s))

    async def stop(self) -> bool:
        """Cancel the task and wait for it; False when it was not running."""
        task, self._task = self._task, None
        if task is None:
            return False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True
