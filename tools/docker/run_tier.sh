#!/usr/bin/env bash
# Run pyfront's opt-in docker tier (tests/tiers/test_docker.py): build docker/Dockerfile on a Docker engine of
# its own, run the image (`pyfront serve --mock-engine`: /health, chat, a stream, the API key, HEALTHCHECK, a
# SIGTERM drain) and docker/compose.yaml against a mock engine on the host.
#
# Usage: tools/docker/run_tier.sh [extra pytest args]
#   1. tools/docker/setup_base.sh: Debian's docker.io, debootstrap and docker-compose (apt-get, when missing) and
#      the base image tarball (debootstrap, cached under ~/.cache/pyfront/docker with a stamp).
#   2. A private dockerd: its own socket and exec-root under /run, its data-root in ~/.cache/pyfront/docker (kept,
#      so a warm run reuses the imported base and the build cache), no iptables, no bridge (containers use
#      --network host). It never touches another Docker engine on the machine, and a lock keeps two runs from
#      sharing the data-root.
#   3. The base image imported from the tarball (again only when the tarball changed), then pytest --docker with
#      the current python (the project venv: `python`, else python3; PYFRONT_PYTHON overrides).
#   On any exit (pass, failure, Ctrl-C) the trap removes every container of the private daemon, stops pytest's
#   process group and the daemon by their pids, unmounts what the daemon left mounted and removes its exec-root.
#   Prints the elapsed time of the whole run, pass or fail.
#   PYFRONT_DOCKER_STORAGE_DRIVER: overlay2 (default; the cache is on ext4 here) or vfs (a copy per layer: slow).
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
log() { echo "run_tier.sh (docker): $*" >&2; }

CACHE="${PYFRONT_DOCKER_CACHE:-$HOME/.cache/pyfront/docker}"
STORAGE_DRIVER="${PYFRONT_DOCKER_STORAGE_DRIVER:-overlay2}"
DATA_ROOT="$CACHE/data-root-$STORAGE_DRIVER"
# Short: containerd puts its shims' unix sockets under the exec-root, and a socket path has at most 107 bytes.
EXEC_ROOT="/run/pyfront-docker.$$"
BASE_IMAGE=local/debian:bookworm-minbase
dockerd_pid=""
pytest_pid=""

# Everything mounted under the daemon's roots, deepest first (netns bind mounts, overlay mounts of containers).
leftover_mounts() {
    findmnt -rn -o TARGET | { grep -E "^($EXEC_ROOT|$DATA_ROOT)(/|$)" || true; } | sort -r
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # pytest's group outlives pytest when pytest was killed before its fixtures stopped the host's mock engine.
    if [[ -n "$pytest_pid" ]] && kill -0 -- "-$pytest_pid" 2>/dev/null; then
        log "stopping what is left of pytest's process group $pytest_pid"
        kill -TERM -- "-$pytest_pid" 2>/dev/null || true
        sleep 2
        kill -KILL -- "-$pytest_pid" 2>/dev/null || true
    fi
    if [[ -n "$dockerd_pid" ]] && kill -0 "$dockerd_pid" 2>/dev/null; then
        # The daemon is this run's own: every container on it is the tier's.
        local ids
        ids=$(docker ps -aq 2>/dev/null || true)
        if [[ -n "$ids" ]]; then
            log "removing containers left on the tier's daemon: $(echo "$ids" | tr '\n' ' ')"
            # shellcheck disable=SC2086
            docker rm -f $ids >/dev/null 2>&1 || true
        fi
        # Old tags and intermediate images: the data-root keeps one pyfront image and its build cache.
        docker image prune -f >/dev/null 2>&1 || true
        kill -TERM "$dockerd_pid" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$dockerd_pid" 2>/dev/null; then
            log "dockerd $dockerd_pid did not stop in 30 s: SIGKILL to its process group"
            kill -KILL -- "-$dockerd_pid" 2>/dev/null || true
        fi
        wait "$dockerd_pid" 2>/dev/null || true
        log "dockerd $dockerd_pid stopped"
    fi
    local mount
    for mount in $(leftover_mounts); do
        umount "$mount" 2>/dev/null || umount -l "$mount" || log "could not unmount $mount"
    done
    rm -rf "$EXEC_ROOT"
    echo "run_tier.sh (docker): elapsed $(($(date +%s) - start_s)) s" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ $(id -u) == 0 ]] || { log "error: the tier runs its own dockerd and needs root"; exit 1; }
# The set-up script logs on stderr and prints the tarball's path as its last stdout line.
TARBALL=$(tools/docker/setup_base.sh | tail -n 1)

mkdir -p "$CACHE"
exec 9>"$CACHE/tier.lock"
flock -w 1800 9 || { log "error: another docker tier run holds $CACHE/tier.lock"; exit 1; }
mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
export DOCKER_HOST="unix://$EXEC_ROOT/docker.sock"
# Debian's docker.io CLI (20.10, the daemon's version; it builds with the classic builder, which needs no buildx).
export PYFRONT_DOCKER=/usr/bin/docker
docker() { "$PYFRONT_DOCKER" "$@"; }

log "starting dockerd (storage driver $STORAGE_DRIVER, data-root $DATA_ROOT, socket $DOCKER_HOST)"
daemon_start=$(date +%s)
setsid dockerd --storage-driver "$STORAGE_DRIVER" --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" \
    --pidfile "$EXEC_ROOT/dockerd.pid" --host "$DOCKER_HOST" --iptables=false --ip-masq=false --ip-forward=false \
    --bridge=none >"$EXEC_ROOT/dockerd.log" 2>&1 &
dockerd_pid=$!
until docker version >/dev/null 2>&1; do
    if ! kill -0 "$dockerd_pid" 2>/dev/null || (($(date +%s) - daemon_start > 60)); then
        log "error: dockerd did not answer on $DOCKER_HOST; its log:"
        tail -n 30 "$EXEC_ROOT/dockerd.log" >&2
        exit 1
    fi
    sleep 0.5
done
log "dockerd $dockerd_pid up in $(($(date +%s) - daemon_start)) s ($(docker version -f '{{.Server.Version}}'))"

# The imported base carries the stamp of the tarball it came from: a rebuilt tarball is imported again.
stamp=$(cat "$TARBALL.stamp")
if [[ "$(docker image inspect -f '{{index .Config.Labels "pyfront.base.stamp"}}' "$BASE_IMAGE" 2>/dev/null)" != "$stamp" ]]
then
    import_start=$(date +%s)
    docker import --change "LABEL pyfront.base.stamp=\"$stamp\"" "$TARBALL" "$BASE_IMAGE" >/dev/null
    log "imported $TARBALL as $BASE_IMAGE in $(($(date +%s) - import_start)) s"
else
    log "$BASE_IMAGE is already imported from this tarball"
fi

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
export PYFRONT_DOCKER_BASE_IMAGE="$BASE_IMAGE" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# pytest in a process group of its own (with the mock engine it starts on the host), so the trap can end it all.
# -rP: the tests print the build, the requests served, the drain and the compose run.
setsid "$PY" -m pytest -q -rP --docker -m docker_tier --durations=0 tests/tiers/test_docker.py "$@" &
pytest_pid=$!
wait "$pytest_pid"
