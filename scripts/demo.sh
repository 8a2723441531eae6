#!/usr/bin/env bash
# The demo of Cascade's main job: builds in release mode, then runs `cascade demo`, which
# compiles the bundled heat-equation simulation (examples/heat/heat.c) and runs it
#   A. straight to a directory on local disk (the stand-in for a parallel file system),
#   B. under `cascade run` with a durable store, SIGKILLed in the middle of a checkpoint,
#   C. again under Cascade: it restarts from the node store's memory,
#   D. after the node store is destroyed: it restarts from the durable store (read-through),
# checks that C and D end bit for bit where the uninterrupted run A ends, and prints the
# per-checkpoint stall times straight to disk vs under Cascade. Exit 0 only if every phase
# passed. Arguments go to `cascade demo` (see `cascade demo --help`):
#
#   ./scripts/demo.sh                              # 2048 x 2048 grid: 32 MiB checkpoints
#   ./scripts/demo.sh --n 512 --steps 60 --every 10 --quiet
#   ./scripts/demo.sh --durable 's3://bucket/demo?endpoint=http://127.0.0.1:7070'
#
# The demo uses its own store (/cascade-demo-<uid>) and work dir, so it never touches your
# default store; rerunning it first removes whatever a previous, interrupted run left.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || {
    echo "demo: cargo not found; run ./scripts/test.sh once to install the toolchain" >&2
    exit 1
}
# The demo compiles heat.c with cc.
if ! command -v cc >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "demo: installing build-essential (for cc)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential >/dev/null
    else
        echo "demo: cc not found; install build-essential (or run ./scripts/test.sh once)" >&2
        exit 1
    fi
fi

echo "== build (release): cascade and libcascade.so"
cargo build --release --quiet -p cascade-cli -p cascade-preload
# A fresh build leaves gigabytes of dirty pages whose writeback would run during the
# measurement (a first run from a fresh clone gave 4.5x where the next gave 14x): flush them.
sync
exec "${CARGO_TARGET_DIR:-target}/release/cascade" demo "$@"
