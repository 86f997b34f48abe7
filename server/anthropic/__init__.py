"""Anthropic's Messages API bodies: msgspec types (`types`), one-pass decoding (`decode`) with vLLM's request
checks (`validate`), and the chat completion request vLLM 0.32 makes of a Messages request (`chat`), which the
chat steps then serve.
"""
