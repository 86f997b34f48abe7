"""The one exception -> status table (server/errors.py): only the client's faults are 4xx, bugs are logged 500s."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest

from pyfront.engine_client.client import EngineDeadError, EngineUnavailableError
from pyfront.server.errors import APIError, DeadlineExceeded, RequestValidationError, to_api_error
from pyfront.server.generate import generation as serving
from pyfront.server.generate import sampling
from tests.harness import MODEL, Harness, running_harness


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with running_harness({"tool_call_parser": "hermes", "enable_auto_tool_choice": True}) as harness:
        yield harness


def test_the_table(caplog: pytest.LogCaptureFixture) -> None:
    assert to_api_error(RequestValidationError("bad", "n")).status == 400
    assert to_api_error(RequestValidationError("bad", "n")).param == "n"
    assert to_api_error(APIError(404, "no model")).status == 404
    assert to_api_error(DeadlineExceeded("late")).status == 504
    assert to_api_error(EngineUnavailableError("busy")).status == 503
    assert to_api_error(EngineDeadError("gone")).status == 500
    assert not caplog.records  # expected outcomes are not logged as bugs
    with caplog.at_level(logging.ERROR, logger="pyfront.server"):
        error = to_api_error(ValueError("an internal invariant broke"))
    assert error.status == 500 and "ValueError" in error.message
    assert "an internal invariant broke" not in error.message  # internals stay in the log
    assert caplog.records and caplog.records[0].exc_info is not None


@pytest.mark.parametrize("stream", [False, True])
def test_a_value_error_deep_in_the_path_is_a_logged_500(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    """It used to become a 400 with the exception's text: a server bug that looked like the client's fault."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("bug in the server")

    monkeypatch.setattr(sampling, "build_sampling_params", broken)
    with caplog.at_level(logging.ERROR, logger="pyfront.server"), harness.http() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": stream})
    assert r.status_code == 500
    body = r.json()["error"]
    assert body["code"] == 500 and body["type"] == "InternalServerError"
    assert any(rec.exc_info and "bug in the server" in str(rec.exc_info[1]) for rec in caplog.records)


def test_an_error_mid_stream_is_a_logged_500_event(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = serving.Generation.on_output
    calls = {"n": 0}

    def flaky(self, choice, output):  # the third output hits a bug
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("detokenizer bug")
        return original(self, choice, output)

    monkeypatch.setattr(serving.Generation, "on_output", flaky)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "stream": True}
    with (
        caplog.at_level(logging.ERROR, logger="pyfront.server"),
        harness.http() as client,
        client.stream("POST", "/v1/completions", json=body) as r,
    ):
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert errors and errors[0]["code"] == 500 and events[-1] == "[DONE]"
    assert any(rec.exc_info and "detokenizer bug" in str(rec.exc_info[1]) for rec in caplog.records)
    # Its engine request was aborted; the mock's thread sees the ABORT a moment after the response ends.
    deadline = time.monotonic() + 5
    while any(stats["running"] for stats in harness.mock.stats()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(stats["running"] == 0 for stats in harness.mock.stats())


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "hi", "stop": [""]}, None),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "a"}}],
                "tool_choice": {"type": "function", "function": {"name": "missing"}},
            },
            "tool_choice",
        ),
    ],
)  # fmt: skip
def test_client_errors_stay_400(harness: Harness, path: str, body: dict, param: str | None) -> None:
    with harness.http() as client:
        r = client.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param
