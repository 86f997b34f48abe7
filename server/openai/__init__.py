"""The OpenAI request bodies: msgspec types (`types`), one-pass decoding (`decode`) with vLLM's request checks
(`validate`), and their JSON Schemas for /openapi.json (`schema`).
"""
