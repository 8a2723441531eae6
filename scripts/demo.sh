#!/usr/bin/env bash
# The demo of Cascade's main job, for now: build in release mode, create a node store,
# write a ~1 GiB checkpoint into it with `cascade put`, read it back with `cascade get`,
# check the bytes are identical, copy it again with an unmodified `cp` under `cascade run`,
# then fsck, status and destroy. Prints the timings.
#
#   ./scripts/demo.sh                    # 1 GiB checkpoint
#   CASCADE_DEMO_MIB=256 ./scripts/demo.sh
#
# The demo uses its own store (/cascade-demo-<uid>) and temp dir, so it never touches your
# default store; rerunning it first removes whatever a previous, interrupted run left.
set -euo pipefail
cd "$(dirname "$0")/.."

size_mib=${CASCADE_DEMO_MIB:-1024}
# Room for two copies of the checkpoint plus a quarter, so the demo measures memory, not
# spill-over.
capacity_mib=$((2 * size_mib + size_mib / 4 + 16))

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || {
    echo "demo: cargo not found; run ./scripts/test.sh once to install the toolchain" >&2
    exit 1
}

step() { printf '\n== %s\n' "$*"; }
seconds_since() { awk -v start="$1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.3f", now - start }'; }

step "build (release)"
cargo build --release --quiet -p cascade-cli
cascade=$PWD/target/release/cascade

export CASCADE_STORE=/cascade-demo-$(id -u)
work=$(mktemp -d "${TMPDIR:-/var/tmp}/cascade-demo.XXXXXX")
export CASCADE_SPILL_PATH=$work/demo.spill
cleanup() {
    "$cascade" destroy --force >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"$cascade" destroy --force >/dev/null 2>&1 || true

shm_free_mib=$(df -Pm /dev/shm | awk 'NR == 2 { print $4 }')
if [ "$shm_free_mib" -lt "$capacity_mib" ]; then
    echo "demo: /dev/shm has ${shm_free_mib} MiB free, need ${capacity_mib} MiB;" \
        "try CASCADE_DEMO_MIB=$((shm_free_mib * 3 / 5))" >&2
    exit 1
fi

step "make a ${size_mib} MiB checkpoint of random data"
start=$(date +%s.%N)
head -c "$((size_mib * 1024 * 1024))" /dev/urandom >"$work/checkpoint.in"
echo "generated $work/checkpoint.in in $(seconds_since "$start") s"

step "create the store (capacity ${capacity_mib} MiB, spill 256 MiB, prefault in the foreground)"
"$cascade" init --capacity "${capacity_mib}MiB" --spill-size 256MiB --prefault foreground

step "write the checkpoint into the store"
"$cascade" put -p "$work/checkpoint.in" /ckpt.0001/rank0.dat

step "read it back (to a local file, then to /dev/null to time the store alone)"
"$cascade" get /ckpt.0001/rank0.dat "$work/checkpoint.out"
"$cascade" get /ckpt.0001/rank0.dat - >/dev/null

step "verify"
cmp "$work/checkpoint.in" "$work/checkpoint.out"
echo "identical: $(stat -c %s "$work/checkpoint.out") bytes"

step "an unmodified program: cp and cmp under \`cascade run\` (LD_PRELOAD), paths under /cascade"
start=$(date +%s.%N)
"$cascade" run -- sh -c "mkdir -p /cascade/ckpt.0002 && cp '$work/checkpoint.in' /cascade/ckpt.0002/rank0.dat"
echo "cp into the store: $(seconds_since "$start") s (includes starting sh, cp and the library)"
"$cascade" run -- cmp "$work/checkpoint.in" /cascade/ckpt.0002/rank0.dat
"$cascade" run -- ls -la /cascade/ckpt.0002

step "ls -l and stat"
"$cascade" ls -l /ckpt.0001
"$cascade" stat /ckpt.0001/rank0.dat

step "fsck"
"$cascade" fsck

step "status"
"$cascade" status

step "destroy"
"$cascade" destroy
