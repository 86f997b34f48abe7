"""Generation: request -> engine SamplingParams (`sampling`, `structured_outputs`), engine requests and their
outputs folded into choices (`generation`, `merge`), request ids (`ids`).
"""
