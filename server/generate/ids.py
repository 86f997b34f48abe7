"""Request ids: the id a response carries, and the engine request id that must be unique."""

from __future__ import annotations

import secrets
import uuid


def base_request_id(header_id: str | None, body_id: str | None) -> str:
    return header_id or body_id or uuid.uuid4().hex


def engine_request_id(base: str) -> str:
    """Unique among in-flight requests even when a client reuses its id (a duplicate kills the engine)."""
    return f"{base}-{secrets.token_hex(4)}"
