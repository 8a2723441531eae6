#!/usr/bin/env bash
# Backs up a series made by make.sh (OUT_DIR/SERIES/snap-00, snap-01, ... in order) into a
# fresh restic repository and a fresh borg repository with their default settings (restic
# 0.14: repository version 2, content-defined chunks of 512 KiB-8 MiB (1 MiB average),
# compression auto = zstd; borg 1.2: `borg init -e none`, buzhash chunks of 512 KiB-8 MiB
# (2 MiB target), lz4) and prints per tool: snapshots, input bytes, stored bytes (du of the
# repository), reduction (input / stored), seconds of the backups (sum; init excluded) and
# MB/s. Separately it prints each tool's start-up time: one backup of an empty directory into
# a fresh repository. Repositories and caches live in a temporary directory under $TMPDIR (or
# /var/tmp), removed at the end. Timings are wall-clock on a possibly shared machine.
#
# usage: restic_borg.sh OUT_DIR SERIES
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 OUT_DIR SERIES" >&2
    exit 2
fi
series_dir=$(cd "$1/$2" && pwd)
series=$2
missing=()
command -v restic >/dev/null 2>&1 || missing+=(restic)
command -v borg >/dev/null 2>&1 || missing+=(borgbackup)
if [ ${#missing[@]} -gt 0 ]; then
    echo "restic_borg.sh: missing Debian package(s): ${missing[*]}" >&2
    exit 1
fi
mapfile -t snaps < <(cd "$series_dir" && find . -mindepth 1 -maxdepth 1 -type d -name 'snap-*' -printf '%f\n' | sort)
if [ ${#snaps[@]} -eq 0 ]; then
    echo "restic_borg.sh: no snap-NN directories in $series_dir" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/restic-borg.XXXXXX")
trap 'rm -rf "$work"' EXIT
export RESTIC_PASSWORD=x RESTIC_CACHE_DIR=$work/restic-cache
export BORG_BASE_DIR=$work/borg-base BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes
mkdir -p "$work/empty"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

restic_init() { restic -r "$1" init >/dev/null; }
restic_backup() { restic -r "$1" backup --quiet "$2" >/dev/null; }
borg_init() { borg init -e none "$1" >/dev/null; }
borg_backup() { borg create "$1::$(basename "$2")-$RANDOM$RANDOM" "$2" >/dev/null; }

input=$(find "${snaps[@]/#/$series_dir/}" -type f -printf '%s\n' | awk '{t += $1} END {print t}')

printf '%-8s %-7s %9s %14s %14s %9s %9s %8s\n' \
    series tool snapshots input_bytes stored_bytes reduction seconds MB/s
startup=()
for tool in restic borg; do
    # Start-up: a fresh repository, one backup of an empty directory.
    "${tool}_init" "$work/$tool-empty"
    t=$(now)
    (cd "$work" && "${tool}_backup" "$work/$tool-empty" empty)
    startup+=("$tool $(elapsed "$t")")

    repo=$work/$tool-repo
    "${tool}_init" "$repo"
    total=0
    for snap in "${snaps[@]}"; do
        t=$(now)
        (cd "$series_dir" && "${tool}_backup" "$repo" "$snap")
        total=$(awk -v a="$total" -v b="$(elapsed "$t")" 'BEGIN { print a + b }')
    done
    stored=$(du -sb "$repo" | cut -f1)
    awk -v s="$series" -v tool="$tool" -v n="${#snaps[@]}" -v i="$input" -v st="$stored" -v t="$total" \
        'BEGIN { printf "%-8s %-7s %9d %14d %14d %8.2fx %9.1f %8.1f\n", s, tool, n, i, st, i / st, t, i / t / 1e6 }'
    rm -rf "$repo" "$work/$tool-empty"
done
for line in "${startup[@]}"; do
    # shellcheck disable=SC2086
    printf 'start-up (backup of an empty directory, fresh repository): %s %s s\n' $line
done
