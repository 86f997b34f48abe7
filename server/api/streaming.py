"""The general streaming path: engine output batches -> SSE frames, for n > 1 or several prompts.

One-choice streams take `api.push.PushStream` instead; both render with the same frames classes
(`api.chat.frames.ChatFrames`, `api.completions.frames.CompletionFrames`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pyfront.engine_client.protocol import (
    EngineCoreOutput,
)
from pyfront.server.api.sse import DONE_FRAME, KEEPALIVE_FRAME, Frames
from pyfront.server.errors import sse_error_frame, to_api_error
from pyfront.server.generate.generation import Choice, Generation
from pyfront.server.state import ServingState


async def stream_frames(
    state: ServingState,
    batches: AsyncIterator[tuple[Choice, list[EngineCoreOutput]]],
    frames: Frames,
    generations: list[Generation],
) -> AsyncIterator[bytes]:
    """An SSE body rendered by `frames`: one bytes item per engine wake-up (one frame per output).

    Whatever ends it (the last output, an error, the client leaving), every engine request of
    `generations` is finished or aborted by the time it returns.
    """

    async def abort() -> None:
        for generation in generations:
            await generation.abort()

    try:
        async for choice, outputs in batches:
            if not outputs:
                yield KEEPALIVE_FRAME
                continue
            if choice.done:
                continue  # with n > 1 a choice's pump reads ahead: what it queued after the end is dropped
            if len(outputs) == 1:
                yield frames.output(choice, outputs[0])
                continue
            parts = []
            for output in outputs:
                if choice.done:
                    break
                parts.append(frames.output(choice, output))
            yield b"".join(parts)
        for generation in generations:
            generation.finish_metrics()
        yield frames.closing()
    except (asyncio.CancelledError, GeneratorExit):
        await abort()
        raise
    except BaseException as exc:
        await abort()
        error = to_api_error(exc)
        state.metrics.error(error.status)
        yield sse_error_frame(error.status, error.message) + DONE_FRAME
    finally:
        await abort()
