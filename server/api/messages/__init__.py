"""POST /v1/messages and /v1/messages/count_tokens: `handler` (the request's steps in order), `convert`
(outputs -> the Message body), `frames` (outputs -> Anthropic's SSE events).
"""
