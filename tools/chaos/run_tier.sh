#!/usr/bin/env bash
# Run pyfront's opt-in chaos tier (tests/tiers/test_chaos.py): two mock engines and two API servers under
# streaming load; an engine is killed, one is stalled, an API server is killed, the killed engine is restarted.
#
# Usage: tools/chaos/run_tier.sh [extra pytest args]
#   Runs from the repo root with the current python (the project venv: `python`, else python3;
#   PYFRONT_PYTHON overrides). No extra venv: the mock engines are pyfront's own. About a minute.
#   Prints the tier's figures (faults, in-flight requests and how they ended, time to fail them, time to
#   re-admit, leaked engine requests) and the elapsed time of the whole run, pass or fail.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh (chaos): elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# -rP: the test prints its figures.
"$PY" -m pytest -q -rP --chaos -m chaos --durations=0 tests/tiers/test_chaos.py "$@"
