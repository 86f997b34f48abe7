"""POST /v1/chat/completions: `handler` (the request's steps in order), `convert` (outputs -> the JSON body),
`frames` (outputs -> SSE chunks).
"""
