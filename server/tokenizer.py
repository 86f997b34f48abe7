"""The token facade: one loaded tokenizer, its chat template, EOS ids and generation defaults.

Everything here is synchronous and may be slow (rendering a long chat, tokenizing 100k tokens): the
server calls it through `anyio.to_thread`, never on the event loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from server.bundled_tokenizer import resolve_tokenizer_name
from server.segment_cache import SegmentTokenizer

logger = logging.getLogger(__name__)

# Keys of generation_config.json that become request defaults, and their SamplingParams names.
_GENERATION_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


class TokenizerError(ValueError):
    """The request cannot be rendered or tokenized (bad messages, template error): a 400."""


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Tokenizer:
    """A Hugging Face tokenizer loaded offline, plus what the server needs to know about the model."""

    def __init__(self, name_or_path: str, *, chat_template: str | None = None, model_dir: str | None = None) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer  # slow import: only at start-up

        path = resolve_tokenizer_name(name_or_path)
        try:
            self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:
            raise RuntimeError(f"cannot load the tokenizer {name_or_path!r} offline: {exc}") from exc
        if not getattr(self.hf, "is_fast", False):
            logger.warning("tokenizer %s is not a fast tokenizer: detokenization will be slower", name_or_path)
        self.name = name_or_path
        if chat_template is not None:
            template_path = Path(chat_template)
            self.hf.chat_template = template_path.read_text() if template_path.is_file() else chat_template
        self.vocab_size = len(self.hf)
        self.eos_token_id: int | None = self.hf.eos_token_id
        config_dir = Path(model_dir or path)
        generation = _load_json(config_dir / "generation_config.json") if config_dir.is_dir() else {}
        eos = generation.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.eos_token_id is None and eos_ids:
            self.eos_token_id = eos_ids[0]
        self.extra_eos_token_ids = [t for t in eos_ids if t != self.eos_token_id]
        self.generation_defaults = {
            ours: generation[theirs] for theirs, ours in _GENERATION_DEFAULTS.items() if theirs in generation
        }
        self.has_chat_template = bool(getattr(self.hf, "chat_template", None))
        # Chat prompts re-send the whole history every turn: tokenize the text between added tokens once per
        # distinct segment (exact, checked at start-up; falls back to plain encode where it would not be).
        # The backend is shared, not copied (~120 MB for Qwen): the server never asks for truncation or padding,
        # so transformers never changes the backend's settings under the cache's feet.
        self.segments = SegmentTokenizer(self.hf, share_backend=True)
        if self.has_chat_template:
            # Compile the template now: the first chat requests would otherwise pay for it (tens of ms).
            with contextlib.suppress(Exception):
                self.render_chat([{"role": "user", "content": "warm-up"}])

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text exactly as transformers' apply_chat_template renders it."""
        if not self.has_chat_template and chat_template is None:
            raise TokenizerError("this model has no chat template; pass --chat-template or use /v1/completions")
        kwargs = dict(chat_template_kwargs or {})
        try:
            return self.hf.apply_chat_template(
                messages,
                tools=tools,
                documents=documents,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # jinja errors, raise_exception() in templates, bad message shapes
            raise TokenizerError(f"cannot render the chat template: {exc}") from None

    def tokenize_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
        """Render, then tokenize without adding special tokens again (the template has them)."""
        text = self.render_chat(messages, **kwargs)
        return text, self.segments.encode(text)
