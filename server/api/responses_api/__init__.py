"""``POST /v1/responses`` (OpenAI's Responses API, as vLLM 0.32 serves it) and its stored responses.

``handler`` walks a request step by step; ``convert`` turns a Responses request into the chat request the
chat steps run and the outputs into output items; ``frames`` renders the streamed events; ``store`` keeps
responses for ``previous_response_id`` and ``GET`` / ``DELETE``; ``routes`` adds the routes by id.
"""
