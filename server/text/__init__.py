"""Text: the tokenizer (`tokenizer`, `segment_cache`, `bundled_tokenizer`) and the way back from token ids to
text (`detokenizer`, `stream`) and logprobs (`logprobs`).
"""
