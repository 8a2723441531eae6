#!/usr/bin/env bash
# Builds and runs the benchmarks; writes <suite>.md, <suite>.json and the plots into --out
# (default bench/results).
# usage: bench/run.sh [--suite node-store|interposition|durable|staging|fuse|dedup|dedup-link|jobs|hostile|dcp|dcp-durable|all] [ARGS...]
# `all` (the default) runs node-store and interposition, and durable, staging, fuse or dedup
# when CASCADE_BENCH_DURABLE=1, _STAGING=1, _FUSE=1 or _DEDUP=1 (never dedup-link, jobs or
# hostile or dcp or dcp-durable: name them). ARGS go to the suite's
# `cascade-bench` subcommand (with `all`, to each: use only --out, --quick, --reps there).
# Quick trial runs: bench/run.sh --suite SUITE --quick --out /tmp/bench (keeps bench/results).
# The suites, what they need (root, network namespaces, restic and borg) and how they measure:
# bench/README.md.
set -euo pipefail

cd "$(dirname "$0")/.."

suite=all
out=bench/results
lib_given=0
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite="${2:-}"; shift 2; continue ;;
        --suite=*) suite="${1#--suite=}"; shift; continue ;;
        --out)
            [ $# -ge 2 ] || { echo "run.sh: --out needs a directory" >&2; exit 2; }
            out="$2"; shift 2; continue ;;
        --out=*) out="${1#--out=}"; shift; continue ;;
        --lib|--lib=*) lib_given=1 ;;
    esac
    args+=("$1")
    shift
done
case "$suite" in
    node-store|interposition|durable|staging|fuse|dedup|dedup-link|jobs|hostile|dcp|dcp-durable|all) ;;
    *) echo "run.sh: --suite must be node-store, interposition, durable, staging, fuse, dedup, dedup-link, jobs, hostile, dcp, dcp-durable or all" >&2; exit 2 ;;
esac
if [ "$suite" = dcp ] || [ "$suite" = dcp-durable ]; then
    # torch.distributed.checkpoint (bench/python): a venv of Debian's python with a current
    # torch and the package built in release mode (a debug build measures the debug build).
    # dcp: how long a save blocks (dcp_stall.py: --mib, --reps, --disk, --out); dcp-durable:
    # how soon a training series is durable over the shaped link (dcp_durable.py: --width,
    # --checkpoints, --steps, --out; root, network namespaces).
    target_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
    cargo build --release -p cascade-cli
    venv="$target_dir/bench-dcp-venv"
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    extra=()
    if [ "$suite" = dcp-durable ]; then
        # s3fs for the baseline (torch's FsspecWriter straight to S3), matplotlib for the plot.
        extra=(s3fs matplotlib)
    fi
    "$venv/bin/python" -m pip install -q maturin numpy torch ${extra[@]+"${extra[@]}"}
    PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python
    script=bench/python/dcp_stall.py
    # The Python scripts take the report's file; --out names a directory here as for every
    # other suite (a path ending in .md is taken as the file itself).
    md="$out"
    if [ "${out%.md}" = "$out" ]; then
        md="$out/$suite.md"
        mkdir -p "$out"
    fi
    args=(--out "$md" ${args[@]+"${args[@]}"})
    if [ "$suite" = dcp-durable ]; then
        [ "$(id -u)" = 0 ] || { echo "run.sh: the dcp-durable suite needs root (network namespaces)" >&2; exit 1; }
        script=bench/python/dcp_durable.py
        # However the run ends: the link and the S3 server down, and the node stores an
        # interrupted run left behind (named after this shell's pid; their agents die with
        # the run).
        export CASCADE_BENCH_RUN=$$
        dcp_durable_down() {
            local s
            for s in /dev/shm/cascade-bench-dcpd-"$CASCADE_BENCH_RUN"-*; do
                [ -e "$s" ] || continue
                case "$s" in *.*) continue ;; esac
                CASCADE_STORE="/$(basename "$s")" "$target_dir/release/cascade" destroy --force >/dev/null 2>&1 || true
            done
            bench/netns-s3.sh down || true
        }
        trap dcp_durable_down EXIT
        bench/netns-s3.sh up >/dev/null
        eval "$(bench/netns-s3.sh env)"
    fi
    CASCADE_BIN="$target_dir/release/cascade" "$venv/bin/python" -W ignore "$script" ${args[@]+"${args[@]}"}
    if [ "$suite" = dcp-durable ]; then
        "$venv/bin/python" bench/plot.py "${md%.md}.json" "$(dirname "$md")"
    fi
    exit
fi
durable=0
if [ "$suite" = durable ] || { [ "$suite" = all ] && [ "${CASCADE_BENCH_DURABLE:-0}" = 1 ]; }; then
    durable=1
fi
staging=0
if [ "$suite" = staging ] || { [ "$suite" = all ] && [ "${CASCADE_BENCH_STAGING:-0}" = 1 ]; }; then
    staging=1
fi
fuse=0
if [ "$suite" = fuse ] || { [ "$suite" = all ] && [ "${CASCADE_BENCH_FUSE:-0}" = 1 ]; }; then
    fuse=1
fi
dedup=0
if [ "$suite" = dedup ] || { [ "$suite" = all ] && [ "${CASCADE_BENCH_DEDUP:-0}" = 1 ]; }; then
    dedup=1
fi
dedup_link=0
if [ "$suite" = dedup-link ]; then
    dedup_link=1
fi
jobs=0
if [ "$suite" = jobs ]; then
    jobs=1
fi
# The hostile-client soak needs nothing but cascade-bench (its staging server is the bench
# executable's own `stage-server` subcommand) and draws no plots.
hostile=0
if [ "$suite" = hostile ]; then
    hostile=1
fi
args=(--out "$out" ${args[@]+"${args[@]}"})

cargo build --release -p cascade-bench
if { [ "$suite" = interposition ] || [ "$suite" = all ]; } && [ "$lib_given" = 0 ]; then
    # The library under test: target/release/libcascade.so (the bench's default --lib).
    cargo build --release -p cascade-preload
fi
if [ "$suite" = interposition ] || [ "$suite" = all ]; then
    # Section 7 (path length) counts instructions with valgrind's callgrind.
    if ! command -v valgrind >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "run.sh: installing valgrind for the path-length section" >&2
        (apt-get install -y -qq valgrind || (apt-get update -qq && apt-get install -y -qq valgrind)) >&2 || true
    fi
fi
if [ "$durable" = 1 ]; then
    # The cascade runs need the CLI and the library; if they do not build, the suite still
    # measures the baselines (its cascade rows then say why not).
    cargo build --release -p cascade-cli -p cascade-preload ||
        echo "run.sh: cascade-cli or cascade-preload did not build; the cascade rows may fail" >&2
fi
if [ "$staging" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "run.sh: the staging suite needs root (network namespaces)" >&2; exit 1; }
    cargo build --release -p cascade-cli -p cascade-preload
    # The disk baselines use fio.
    if ! command -v fio >/dev/null && command -v apt-get >/dev/null; then
        echo "run.sh: installing fio for the disk baselines" >&2
        (apt-get install -y -qq fio || (apt-get update -qq && apt-get install -y -qq fio)) >&2 || true
    fi
fi
if [ "$fuse" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "run.sh: the fuse suite needs root (cascade mount)" >&2; exit 1; }
    # `cascade mount` and, for the preload target, libcascade.so next to it.
    cargo build --release -p cascade-cli -p cascade-preload
fi
if [ "$dedup" = 1 ]; then
    # The baselines: restic, borg and the zstd CLI (Debian packages).
    need=()
    command -v restic >/dev/null || need+=(restic)
    command -v borg >/dev/null || need+=(borgbackup)
    command -v zstd >/dev/null || need+=(zstd)
    if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "run.sh: installing ${need[*]} for the dedup baselines" >&2
        (apt-get install -y -qq "${need[@]}" || (apt-get update -qq && apt-get install -y -qq "${need[@]}")) >&2 || true
    fi
fi
if [ "$dedup_link" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "run.sh: the dedup-link suite needs root (network namespaces)" >&2; exit 1; }
    cargo build --release -p cascade-cli
    # The series (idempotent: keeps what is there): full size, or with --quick the small
    # series of the dedup suite's --quick.
    case " ${args[*]} " in
        *" --datasets"*) ;;
        *" --quick "*)
            bash bench/datasets/make.sh --quick /var/tmp/cascade-datasets-quick torch numpy lammps >&2
            args+=(--datasets /var/tmp/cascade-datasets-quick) ;;
        *) bash bench/datasets/make.sh /var/tmp/cascade-datasets torch numpy lammps >&2 ;;
    esac
fi
if [ "$jobs" = 1 ]; then
    # The simulated nodes' ranks and agents run the CLI (and its preload library); the
    # shaped link needs root and network namespaces.
    [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1 ||
        { echo "run.sh: the jobs suite needs root and network namespaces (bench/netns-s3.sh), unavailable here" >&2; exit 1; }
    cargo build --release -p cascade-cli -p cascade-preload
fi
# Where cargo put them: CARGO_TARGET_DIR if set.
release="${CARGO_TARGET_DIR:-target}/release"
bin="$release/cascade-bench"

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
# Every suite but jobs and hostile draws one (durable and dedup-link included: leaving them
# out here kept their committed PNGs from the day the plots came).
py=""
[ "$suite" = jobs ] || [ "$suite" = hostile ] || py=$(find_python)
if [ "$suite" != jobs ] && [ "$suite" != hostile ] && [ -z "$py" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
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

# The durable suite: the throttled S3 store, taken down again however the script ends (and
# the suite's node store, which an interrupted run leaves behind).
netns_down() {
    CASCADE_STORE=/cascade-bench-durable "$release/cascade" destroy --force >/dev/null 2>&1 || true
    CASCADE_STORE=/cascade-bench-dedup-link "$release/cascade" destroy --force >/dev/null 2>&1 || true
    if [ "$staging" = 1 ]; then
        bench/netns-staging.sh down || true
    fi
    bench/netns-s3.sh down || true
}
if [ "$durable" = 1 ] || [ "$staging" = 1 ] || [ "$dedup_link" = 1 ] || [ "$jobs" = 1 ]; then
    trap netns_down EXIT
    bench/netns-s3.sh up >/dev/null
    eval "$(bench/netns-s3.sh env)"
fi
if [ "$staging" = 1 ]; then
    # The staging servers' namespace (10 Gbit/s link), routed to the S3 namespace.
    bench/netns-staging.sh up
    eval "$(bench/netns-staging.sh env)"
fi

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
    if [ "$sub" = jobs ] || [ "$sub" = hostile ]; then
        return
    fi
    if [ -n "$py" ]; then
        "$py" bench/plot.py "$out/$json" "$out"
    else
        echo "run.sh: no python3 with matplotlib; skipped the plots" >&2
    fi
}

if [ "$suite" = node-store ] || [ "$suite" = all ]; then
    run_suite run node-store.json
    echo "results: $out/node-store.md"
fi
if [ "$suite" = interposition ] || [ "$suite" = all ]; then
    run_suite interposition interposition.json
    echo "results: $out/interposition.md"
fi
if [ "$durable" = 1 ]; then
    run_suite durable durable.json
    echo "results: $out/durable.md"
fi
if [ "$staging" = 1 ]; then
    run_suite staging staging.json
    echo "results: $out/staging.md"
fi
if [ "$fuse" = 1 ]; then
    run_suite fuse fuse.json
    echo "results: $out/fuse.md"
fi
if [ "$dedup" = 1 ]; then
    run_suite dedup dedup.json
    echo "results: $out/dedup.md"
fi
if [ "$dedup_link" = 1 ]; then
    run_suite dedup-link dedup-link.json
    echo "results: $out/dedup-link.md"
fi
if [ "$jobs" = 1 ]; then
    run_suite jobs jobs.json
    echo "results: $out/jobs.md"
fi
if [ "$hostile" = 1 ]; then
    run_suite hostile hostile.json
    echo "results: $out/hostile.md"
fi
trap - INT TERM
