"""A streamed answer's SSE response, and the general streaming path that background responses run.

`streamed_response` makes every streamed HTTP answer (any n, any number of prompts): `api.push.PushStream`
writes it from the engine client's output loop. `stream_frames` runs in a task and yields the body instead:
a background response (api.responses_api.background) has no client to write to, only an event log. Both
render with the same frames (`api.chat.frames.ChatFrames`, `api.completions.frames.CompletionFrames`, ...).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from pyfront.engine_client.protocol import (
    EngineCoreOutput,
)
from pyfront.server.api.push import PushStream
from pyfront.server.api.sse import KEEPALIVE_FRAME, Frames, SSEResponse
from pyfront.server.errors import to_api_error
from pyfront.server.generate.generation import Choice, Generation
from pyfront.server.state import ServingState


def streamed_response(
    state: ServingState,
    frames: Frames,
    generations: list[Generation],
    headers: dict[str, str],
    on_close: Callable[[], None],
) -> SSEResponse:
    """The SSE response of `generations` (every choice of each), written by a PushStream.

    `on_close` runs once the response has ended, however it ended (it releases the admission).
    """
    pusher = PushStream(generations, frames, state.metrics)
    return SSEResponse(None, headers, on_close=on_close, pusher=pusher)


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
        yield frames.error(error.status, error.message)
    finally:
        await abort()
