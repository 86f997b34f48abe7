"""Request ids: engine ids keep the shape vLLM's front end gives them and differ between requests, between
instances and across a fork; response ids come from the OS's randomness."""

from __future__ import annotations

import os
import re

import pytest

from pyfront.server.ids import EngineRequestIds, base_request_id


def test_engine_ids_are_the_base_plus_8_hex_digits_and_differ() -> None:
    ids = EngineRequestIds()
    made = [ids("chatcmpl-abc") for _ in range(10_000)]
    assert all(re.fullmatch(r"chatcmpl-abc-[0-9a-f]{8}", i) for i in made)
    assert len(set(made)) >= 9_990  # 32 random bits: a repeat in 10k draws has probability ~1 %
    first, second = EngineRequestIds(), EngineRequestIds()  # each seeded from the OS: other sequences
    assert [first("x") for _ in range(4)] != [second("x") for _ in range(4)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_other_bits() -> None:
    ids = EngineRequestIds()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids after the fork
        os.write(write, ",".join(ids("r") for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split(",")
    os.close(read)
    os.waitpid(pid, 0)
    parent = [ids("r") for _ in range(4)]
    assert len(child) == 4 and child != parent


def test_base_ids_prefer_the_clients_and_are_uuid4_otherwise() -> None:
    assert base_request_id("hdr", "body") == "hdr"
    assert base_request_id(None, "body") == "body"
    made = base_request_id(None, None)
    assert re.fullmatch(r"[0-9a-f]{32}", made) and made[12] == "4"
