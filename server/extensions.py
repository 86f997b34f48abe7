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


HOLD_HEAD = "pyfront.hold_head"
"""A key of an ``http.response.start`` message (not a scope extension: a message key other servers ignore). True on
a chunked response: the server may hold the head back and write it with the first body message, so that the head
and the first event are one write (one system call). The application sends a body message (an empty one will do)
when the head must go out without an event; server/api/push.py does within ``PushStream.HEAD_HOLD_S``."""


WhenDisconnected = Callable[[Callable[[], object] | None], None]


class Disconnect(TypedDict):
    when_disconnected: WhenDisconnected
