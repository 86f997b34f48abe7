"""Run lm-evaluation-harness against OpenAI-compatible servers and dump every sample, for comparison.

Runs under the clients venv's python (tools/real_clients/setup_venv.sh), never the project's: it imports
lm_eval. Usage:

    python lm_eval_run.py JOB.json OUT.json

JOB.json: {"servers": [{"name", "base_url", "model"}], "tokenizer": DIR, "task_dir": DIR,
"completions_tasks": [...], "chat_tasks": [...], "completions_args": {...}, "chat_args": {...}}.
For each server, ``local-completions`` runs the completions tasks (loglikelihood, loglikelihood_rolling,
generate_until: whatever the task YAMLs in task_dir ask) and ``local-chat-completions`` the chat tasks,
both through lm_eval's Python API with the task dir's custom tasks only (no built-in task, no download).

OUT.json: {server name: {"completions"|"chat": {task: [sample, ...]}}}, each sample reduced to what the
model answered (doc_id, arguments, resps, filtered_resps) and the task's request type, sorted by doc_id, so that two
servers' answers compare with ==. Servers run one after the other in one process (lm_eval and torch
import once: about 10 s saved per server on 2 cores).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

# lm-eval's task output types, as the request type each of their samples sent.
REQUEST_TYPES = {"multiple_choice": "loglikelihood", "loglikelihood": "loglikelihood",
                 "loglikelihood_rolling": "loglikelihood_rolling", "generate_until": "generate_until"}  # fmt: skip


def _reduce(samples: list[dict[str, Any]], output_type: str) -> list[dict[str, Any]]:
    """The model-dependent part of lm_eval's logged samples (doc, target and metrics follow from them)."""
    keep = ("doc_id", "arguments", "resps", "filtered_resps")
    reduced = [{k: sample[k] for k in keep} for sample in sorted(samples, key=lambda s: s["doc_id"])]
    for sample in reduced:
        sample["request_type"] = REQUEST_TYPES[output_type]
    return reduced


def _evaluate(model: str, model_args: dict[str, Any], tasks: list[str], task_dir: str, **kwargs: Any) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=TaskManager(include_path=task_dir, include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        **kwargs,
    )
    assert results is not None
    configs = results["configs"]
    return {task: _reduce(samples, configs[task]["output_type"]) for task, samples in results["samples"].items()}


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    out: dict[str, dict[str, Any]] = {}
    for server in job["servers"]:
        t0 = time.monotonic()
        base = server["base_url"].rstrip("/")
        common = {"model": server["model"], "tokenizer_backend": "huggingface", "tokenizer": job["tokenizer"]}
        out[server["name"]] = {
            "completions": _evaluate(
                "local-completions",
                {**common, "base_url": f"{base}/v1/completions", **job.get("completions_args", {})},
                job["completions_tasks"],
                job["task_dir"],
            ),
            "chat": _evaluate(
                "local-chat-completions",
                {**common, "base_url": f"{base}/v1/chat/completions", **job.get("chat_args", {})},
                job["chat_tasks"],
                job["task_dir"],
                apply_chat_template=True,
            ),
        }
        print(f"lm_eval_run: {server['name']} took {time.monotonic() - t0:.1f} s", file=sys.stderr)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
