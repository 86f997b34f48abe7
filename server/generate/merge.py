"""Interleaving several async iterators as their items arrive (n > 1 choices, several prompts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


async def merge(sources: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """Interleave several async iterators as items arrive.

    Errors from any source are raised to the consumer; the pumps are cancelled when it stops.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    done = object()

    async def pump(source: AsyncIterator[Any]) -> None:
        try:
            async for item in source:
                await queue.put(item)
        except BaseException as exc:  # handed to the consumer
            await queue.put(_Failure(exc))
        finally:
            await queue.put(done)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, _Failure):
                raise item.error
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error
