"""The HTTP server: an OpenAI-compatible API (and Anthropic's Messages API) in front of vLLM EngineCore processes.

A request takes these steps, each in one package: `api` receives it (fast lane, middleware, the route's
handler) and `openai` parses and validates its body (`anthropic` a Messages body, made into a chat
request); `chat` renders the prompt and plans how the output is parsed; `generate` builds the sampling
parameters and the engine requests and folds the engine's outputs into choices, using `text` to
detokenize, apply stop strings and format logprobs; `api` turns the choices into the JSON body or the SSE
frames. The handler calls the steps in order, so the packages import one way:
`api` -> `generate` -> `chat` -> `text`, each only those after it, and all of them the shared `openai` and
`anthropic` (request types), `state`, `errors`, `config`, `metrics`, `ids` and `pacing` (tests/test_layout.py
checks it).
"""
