"""The OpenAI Agents SDK's one-tool agent loop against a server, with its default model (the Responses API).

Run in the clients venv (tools/real_clients/setup_venv.sh): ``python agents_loop.py BASE_URL MODEL OUT.json``.
The agent has one function tool, ``get_weather``; the run asks for the weather, so the model (a mock engine
scripted by tests/tiers/test_real_clients_agents.py) calls the tool, the SDK runs it and sends its output
back, and the model answers. Once with ``Runner.run`` and once streamed (``Runner.run_streamed``). Writes
what the SDK saw: the final output, the tool's calls, the run items' types, and any error.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


async def run(base_url: str, model: str) -> dict[str, Any]:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
    # The SDK's default model class, given as an object: a served model named by a path ("/.../tiny-qwen3")
    # would otherwise be read as a "provider/model" name.
    responses_model = OpenAIResponsesModel(model=model, openai_client=client)
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=responses_model)
    out: dict[str, Any] = {}
    for mode in ("run", "streamed"):
        CALLS.clear()
        try:
            if mode == "run":
                result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
                events: list[str] = []
            else:
                streamed = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
                events = [e.type async for e in streamed.stream_events()]
                result = streamed
            out[mode] = {
                "final_output": result.final_output,
                "tool_calls": list(CALLS),
                "items": [item.type for item in result.new_items],
                "responses": len(result.raw_responses),
                "stream_event_kinds": sorted(set(events)),
            }
        except Exception as exc:  # what the SDK raised is the finding: reported, not hidden
            out[mode] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main() -> None:
    base_url, model, out_path = sys.argv[1:4]
    with open(out_path, "w") as f:
        json.dump(asyncio.run(run(base_url, model)), f, indent=1)


if __name__ == "__main__":
    main()
