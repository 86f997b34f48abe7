"""The OpenAI Agents SDK (openai-agents, clients venv) running a one-tool agent loop against pyfront.

Run with ``python -m pytest -q --real-clients -m real_clients tests/tiers/test_real_clients_agents.py`` (or
``tools/real_clients/run_tier.sh``). The SDK's default model speaks the Responses API: it sends the
conversation as items (its own function_call and function_call_output items included) every turn. pyfront and
vLLM 0.32's own front end, each on a mock engine scripted with the same outputs (the call, then the answer;
once run, once streamed), must both complete the loop with the same final output, tool calls and run items
(one vLLM streaming quirk pinned).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.tiers import test_real_clients as clients
from tests.tiers import test_real_engine as tier
from tools.real_engine import engine as real_engine

pytestmark = pytest.mark.real_clients

vllm_venv = tier.vllm_venv
tiny_model = tier.tiny_model
tokenizer = tier.tokenizer
clients_venv = clients.clients_venv

CALL = "<think>\nI need the weather.\n</think>\n\n" + tier._hermes_call("get_weather", {"city": "Paris"})
ANSWER = "<think>\nThe tool says sunny.\n</think>\n\nIt is sunny in Paris."
EXPECTED = {"final_output": "\n\nIt is sunny in Paris.", "tool_calls": ["Paris"],
            "items": ["reasoning_item", "tool_call_item", "tool_call_output_item", "reasoning_item",
                      "message_output_item"], "responses": 2}  # fmt: skip


def test_agents_sdk_tool_loop_against_pyfront(
    tiny_model: Path, vllm_venv: Path, clients_venv: Path, tokenizer, tmp_path: Path
) -> None:
    t_test = time.monotonic()
    script = [tokenizer.encode(text, add_special_tokens=False) for text in (CALL, ANSWER, CALL, ANSWER)]
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    mock_args = ("--script-file", str(script_file), "--step-interval", "0.002")
    flags = tier._parser_flags("hermes")
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = tier._ports(4)
    results: dict[str, dict] = {}
    with tier.managed_processes() as procs:
        frontend = procs.add(real_engine.start_vllm_frontend(tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log",
                                                             venv=vllm_venv, extra_args=flags))  # fmt: skip
        vllm_mock = procs.add(tier._start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args))
        pyfront = procs.add(tier._start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log",
                                                       *flags))  # fmt: skip
        pyfront_mock = procs.add(tier._start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args))
        real_engine.wait_healthy(pyfront, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[vllm_mock])
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            out = tmp_path / f"agents-{side}.json"
            cmd = [clients._clients_python(clients_venv), str(clients.CLIENTS_DIR / "agents_loop.py"), server.url,
                   tier._model_id(server.url), str(out)]  # fmt: skip
            clients._run_client(cmd, f"the Agents SDK loop against {side}", tmp_path / f"agents-{side}.log")
            results[side] = json.loads(out.read_text())
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))
    print(f"\nAgents SDK loops took {time.monotonic() - t_test:.1f} s: {json.dumps(results)}")

    def seen(side: str, mode: str) -> dict:
        return {k: v for k, v in results[side][mode].items() if k != "stream_event_kinds"}

    # The text after </think> keeps its "\n\n" on both sides (the qwen3 reasoning parser's, as vLLM's).
    assert seen("pyfront", "run") == seen("pyfront", "streamed") == seen("vllm", "run") == EXPECTED, results
    assert results["pyfront"]["streamed"]["stream_event_kinds"] == results["vllm"]["streamed"]["stream_event_kinds"]
    # vLLM 0.32's stream sends the "\n\n" between </think> and the call as a message item of its own (as in
    # test_real_engine_responses.py), which the SDK keeps as one more message_output_item; pyfront's stream is
    # its non-streamed answer.
    vllm_streamed = seen("vllm", "streamed")
    assert vllm_streamed["items"] == [*EXPECTED["items"][:1], "message_output_item", *EXPECTED["items"][1:]]
    assert {**vllm_streamed, "items": EXPECTED["items"]} == EXPECTED
