"""The ASGI scope extensions `pyfront serve`'s server offers the application, by name (one definition for both).

An application must work without them (another ASGI server, tests' transports): each is looked up in
``scope["extensions"]`` and used only when present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

DISCONNECT = "pyfront.disconnect"
"""``{"when_disconnected": fn}``: ``fn(callback)`` has ``callback()`` called once, at once, if the client goes away
before the response is complete; ``fn(None)`` stops it (server/http_cycle.py's DisconnectWatch)."""


class Disconnect(TypedDict):
    when_disconnected: Callable[[Callable[[], object] | None], None]
