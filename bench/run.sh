#!/usr/bin/env bash
# Builds and runs the benchmarks; writes into bench/results/:
#   node-store.{md,json}, chunk-sweep.png, spill-over.png       (suite node-store)
#   interposition.{md,json}, interposition-sweep.png            (suite interposition)
# usage: bench/run.sh [--suite node-store|interposition|all] [ARGS...]
# The suite defaults to all (both, one after the other). ARGS go to `cascade-bench run`
# (node-store) or `cascade-bench interposition`; with --suite all they go to both, so use
# only options both know there (--out, --quick, --reps, --procs, --size-mib). E.g.
#   bench/run.sh --quick --out /tmp/bench      (a minute or two; keeps the committed results)
#   bench/run.sh --suite node-store --only writes,readback --reps 5
#   bench/run.sh --suite interposition --only small,meta
#   bench/run.sh --suite interposition --lib /path/to/libcascade.so
# See bench/README.md.
set -euo pipefail

cd "$(dirname "$0")/.."

suite=all
out=bench/results
out_given=0
lib_given=0
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite="${2:-}"; shift 2; continue ;;
        --suite=*) suite="${1#--suite=}"; shift; continue ;;
        --out) out="${2:-$out}"; out_given=1 ;;
        --out=*) out="${1#--out=}"; out_given=1 ;;
        --lib|--lib=*) lib_given=1 ;;
    esac
    args+=("$1")
    shift
done
case "$suite" in
    node-store|interposition|all) ;;
    *) echo "run.sh: --suite must be node-store, interposition or all" >&2; exit 2 ;;
esac
if [ "$out_given" = 0 ]; then
    args=(--out "$out" ${args[@]+"${args[@]}"})
fi

cargo build --release -p cascade-bench
if [ "$suite" != node-store ] && [ "$lib_given" = 0 ]; then
    # The library under test: target/release/libcascade.so (the bench's default --lib).
    cargo build --release -p cascade-preload
fi
bin=target/release/cascade-bench

# The plots need matplotlib: use the first python3 that has it (a pyenv python3 on PATH may
# not; Debian's /usr/bin/python3 gets it from the python3-matplotlib package).
find_python() {
    for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then
            echo "$py"
            return
        fi
    done
}
py=$(find_python)
if [ -z "$py" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "run.sh: installing python3-matplotlib for the plots" >&2
    (apt-get update -qq && apt-get install -y -qq python3-matplotlib) >&2 || true
    py=$(find_python)
fi

# The benchmark cleans up after itself, also on errors; if it is interrupted, remove what
# it left (stores, shm objects, files in /var/tmp) by its pid.
pid=""
on_signal() {
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        "$bin" cleanup --pid "$pid" >&2 || true
    fi
    exit 130
}
trap on_signal INT TERM

# Runs one suite (`cascade-bench SUBCOMMAND ARGS...`), then its plots.
run_suite() {
    local sub="$1" json="$2"
    "$bin" "$sub" ${args[@]+"${args[@]}"} &
    pid=$!
    set +e
    wait "$pid"
    local rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        "$bin" cleanup --pid "$pid" >&2 || true
        exit "$rc"
    fi
    pid=""
    if [ -n "$py" ]; then
        "$py" bench/plot.py "$out/$json" "$out"
    else
        echo "run.sh: no python3 with matplotlib; skipped the plots" >&2
    fi
}

if [ "$suite" != interposition ]; then
    run_suite run node-store.json
    echo "results: $out/node-store.md"
fi
if [ "$suite" != node-store ]; then
    run_suite interposition interposition.json
    echo "results: $out/interposition.md"
fi
trap - INT TERM
