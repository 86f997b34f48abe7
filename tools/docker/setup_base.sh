#!/usr/bin/env bash
# Set up what pyfront's opt-in docker tier needs on the host: Debian's Docker engine and compose, and a base
# image tarball made from Debian's own packages (no image registry is reachable from these machines, so
# `FROM python:3.11-slim` cannot be pulled).
#
# Usage: tools/docker/setup_base.sh
#   PYFRONT_DOCKER_CACHE  where the tarball is kept (default ~/.cache/pyfront/docker)
#   PYFRONT_DOCKER_FORCE=1  rebuilds the tarball even when its stamp matches
# Prints the tarball's path as its last stdout line; logs go to stderr.
#
# 1. `apt-get install docker.io debootstrap docker-compose` when any of dockerd, debootstrap or docker-compose is
#    missing (a fresh machine; about 2 minutes). Their postinst scripts start no service here (no init system), so
#    nothing runs until tools/docker/run_tier.sh starts its own dockerd.
# 2. `debootstrap --variant=minbase bookworm` with python3 and python3-venv (bookworm ships Python 3.11, the
#    version the host builds the wheelhouse with; minbase has python3 but not venv/ensurepip, which the
#    Dockerfile's `python3 -m venv` needs), packed as a tar (about 4 minutes, ~210 MB). The tar is written under a
#    temporary name and renamed, with a stamp naming this script's version and the package list, so a run that
#    stops half-way never leaves a tarball that looks complete.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/venv.sh" # die, log

LOG_NAME="setup_base.sh (docker)"
SCRIPT_VERSION=2
SUITE=bookworm
INCLUDE=python3,python3-venv
CACHE="${PYFRONT_DOCKER_CACHE:-$HOME/.cache/pyfront/docker}"
TARBALL="$CACHE/debian-$SUITE-minbase.tar"
STAMP="$TARBALL.stamp"
STAMP_CONTENT="pyfront docker/setup_base.sh v$SCRIPT_VERSION debootstrap --variant=minbase --include=$INCLUDE $SUITE"

missing=()
for tool in dockerd debootstrap docker-compose; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || die "${missing[*]} missing and not root: apt-get install docker.io debootstrap docker-compose"
    log "installing docker.io debootstrap docker-compose (missing: ${missing[*]})"
    apt_start=$(date +%s)
    # An index older than the mirror gives 404s for superseded packages: refresh it first.
    apt-get update -q >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap docker-compose \
        >&2 || die "apt-get install docker.io debootstrap docker-compose failed"
    log "apt-get install took $(($(date +%s) - apt_start)) s"
fi

if [[ "${PYFRONT_DOCKER_FORCE:-0}" != 1 && -f "$TARBALL" && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    log "base tarball $TARBALL is complete (stamp matches v$SCRIPT_VERSION); $(du -h "$TARBALL" | cut -f1)"
    echo "$TARBALL"
    exit 0
fi
rm -f "$STAMP"
mkdir -p "$CACHE"
rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
# The rootfs holds device nodes and root-owned files: remove it however this script ends.
trap 'rm -rf "$rootfs" "$TARBALL.partial"' EXIT
log "debootstrap --variant=minbase --include=$INCLUDE $SUITE $rootfs (a few minutes)"
boot_start=$(date +%s)
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$rootfs" >"$CACHE/debootstrap.log" 2>&1 \
    || die "debootstrap failed; its log: $CACHE/debootstrap.log (tail: $(tail -n 5 "$CACHE/debootstrap.log"))"
chroot "$rootfs" python3 -c 'import ensurepip, sys, venv; assert sys.version_info[:2] == (3, 11), sys.version' \
    || die "the rootfs has no Python 3.11 with venv/ensurepip"
# apt's package lists and caches are not needed in an image.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
# mktemp made the directory 0700, and it becomes the image's /: a non-root user could not reach /bin/sh.
chmod 0755 "$rootfs"
tar -C "$rootfs" --numeric-owner -cf "$TARBALL.partial" .
mv "$TARBALL.partial" "$TARBALL"
echo "$STAMP_CONTENT" >"$STAMP"
log "base tarball built in $(($(date +%s) - boot_start)) s: $TARBALL, $(du -h "$TARBALL" | cut -f1)"
echo "$TARBALL"
