#!/usr/bin/env bash
# Builds and runs the node-store benchmarks; writes bench/results/node-store.{md,json} and the
# plots chunk-sweep.png and spill-over.png. Extra arguments go to `cascade-bench run`, e.g.
#   bench/run.sh --quick --out /tmp/bench      (about a minute; keeps the committed results)
#   bench/run.sh --only writes,readback --reps 5
# See bench/README.md.
set -euo pipefail

cd "$(dirname "$0")/.."

out=bench/results
out_given=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --out) out="${args[$((i + 1))]:-$out}"; out_given=1 ;;
        --out=*) out="${args[$i]#--out=}"; out_given=1 ;;
    esac
done
if [ "$out_given" = 0 ]; then
    set -- --out "$out" "$@"
fi

cargo build --release -p cascade-bench
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

"$bin" run "$@" &
pid=$!
set +e
wait "$pid"
rc=$?
set -e
trap - INT TERM
if [ "$rc" -ne 0 ]; then
    "$bin" cleanup --pid "$pid" >&2 || true
    exit "$rc"
fi

if [ -n "$py" ]; then
    "$py" bench/plot.py "$out/node-store.json" "$out"
else
    echo "run.sh: no python3 with matplotlib; skipped the plots" >&2
fi
echo "results: $out/node-store.md"
