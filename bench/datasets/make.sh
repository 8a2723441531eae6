#!/usr/bin/env bash
# Generates checkpoint series made by real programs run on this machine (see README.md here):
#   OUT_DIR/<series>/snap-NN/...   one directory per snapshot, in order
# Series: torch (PyTorch training loop), numpy (heat-diffusion simulation), lammps (LAMMPS
# binary restarts). Default: all three. --quick makes small, short versions (for tests).
#
# Idempotent: a series whose OUT_DIR/<series>/.done names the same generator version and mode
# is skipped. A series is built in OUT_DIR/.<series>.tmp and renamed when complete. Installs
# nothing: when a tool is missing it says which Debian package to install and exits 1.
# Python: $PYTHON, else /usr/bin/python3 (Debian's, which has python3-torch and python3-numpy),
# else python3.
#
# usage: make.sh [--quick] OUT_DIR [SERIES...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# Bump a series' version whenever its generator changes the bytes it writes.
declare -A version=([torch]=2 [numpy]=1 [lammps]=1)

mode=full
if [ "${1:-}" = "--quick" ]; then
    mode=quick
    shift
fi
if [ $# -lt 1 ]; then
    echo "usage: $0 [--quick] OUT_DIR [torch|numpy|lammps ...]" >&2
    exit 2
fi
out=$1
shift
series=("$@")
[ ${#series[@]} -gt 0 ] || series=(torch numpy lammps)

if [ -z "${PYTHON:-}" ]; then
    if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi

missing=()
for s in "${series[@]}"; do
    case $s in
    torch) "$PYTHON" -c 'import torch' 2>/dev/null || missing+=(python3-torch) ;;
    numpy) "$PYTHON" -c 'import numpy' 2>/dev/null || missing+=(python3-numpy) ;;
    lammps) command -v lmp >/dev/null 2>&1 || command -v lmp_serial >/dev/null 2>&1 || missing+=(lammps) ;;
    *)
        echo "make.sh: unknown series '$s' (torch, numpy, lammps)" >&2
        exit 2
        ;;
    esac
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "make.sh: missing Debian package(s): ${missing[*]} (apt-get install --no-install-recommends ${missing[*]}; Python used: $PYTHON)" >&2
    exit 1
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
printf '%-8s %9s %15s %9s  %s\n' series snapshots bytes/snapshot seconds status
for s in "${series[@]}"; do
    dir=$out/$s
    stamp="version=${version[$s]} mode=$mode"
    if [ -f "$dir/.done" ] && [ "$(head -n1 "$dir/.done")" = "$stamp" ]; then
        read -r snaps per seconds < <(sed -n 2p "$dir/.done")
        printf '%-8s %9s %15s %9s  %s\n' "$s" "$snaps" "$per" "$seconds" "up to date"
        continue
    fi
    tmp=$out/.$s.tmp
    rm -rf "$tmp"
    mkdir -p "$tmp"
    start=$(date +%s.%N)
    quick=()
    [ "$mode" = quick ] && quick=(--quick)
    case $s in
    torch) cmd=("$PYTHON" "$here/torch_series.py" "${quick[@]}" "$tmp") ;;
    numpy) cmd=("$PYTHON" "$here/numpy_series.py" "${quick[@]}" "$tmp") ;;
    lammps) cmd=("$here/lammps_series.sh" "${quick[@]}" "$tmp") ;;
    esac
    if ! "${cmd[@]}" 2>"$out/.$s.log"; then
        echo "make.sh: generating $s failed; last lines of $out/.$s.log:" >&2
        tail -n 20 "$out/.$s.log" >&2
        exit 1
    fi
    seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    mv "$out/.$s.log" "$tmp/generate.log"
    snaps=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'snap-*' | wc -l)
    bytes=$(find "$tmp" -mindepth 2 -path "$tmp/snap-*" -type f -printf '%s\n' | awk '{t += $1} END {print t}')
    per=$((bytes / snaps))
    rm -rf "$dir"
    mv "$tmp" "$dir"
    printf '%s\n%s %s %s\n' "$stamp" "$snaps" "$per" "$seconds" >"$dir/.done"
    printf '%-8s %9s %15s %9s  %s\n' "$s" "$snaps" "$per" "$seconds" generated
done
