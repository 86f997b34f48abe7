"""Chat: messages -> the rendered prompt (`render`), and how the generated text is parsed back into reasoning,
content and tool calls (`plan`, `parsers`).
"""
