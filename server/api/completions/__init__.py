"""POST /v1/completions: `handler` (the request's steps in order), `convert` (prompts -> ids, outputs -> the
JSON body), `frames` (outputs -> SSE chunks).
"""
