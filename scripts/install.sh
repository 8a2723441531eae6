#!/usr/bin/env bash
# Installs Cascade under a prefix: the `cascade` command, libcascade.so and
# libcascade_wrap.a, include/cascade.h, a pkg-config file, the systemd units and Slurm
# scripts of contrib/, shell completions and man pages (docs/install.md).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/install.sh [--prefix PREFIX] [--bin-dir DIR | --target-dir DIR] [--no-build]

Installs Cascade under PREFIX (default /usr/local):
  PREFIX/bin/cascade
  PREFIX/lib/libcascade.so, PREFIX/lib/libcascade_wrap.a
  PREFIX/include/cascade.h
  PREFIX/lib/pkgconfig/cascade.pc      (pkg-config --cflags --libs cascade)
  PREFIX/share/cascade/systemd/        systemd units (ExecStart pointing at PREFIX/bin/cascade)
  PREFIX/share/cascade/slurm/          Slurm prolog, epilog and batch scripts
  PREFIX/share/bash-completion/completions/cascade
  PREFIX/share/zsh/site-functions/_cascade
  PREFIX/share/fish/vendor_completions.d/cascade.fish
  PREFIX/share/man/man1/cascade.1, cascade-run.1, ... (one page per subcommand)
  PREFIX/share/doc/cascade/            README.md, LICENSE

The installed cascade finds PREFIX/lib/libcascade.so by itself (../lib from its own
directory), for `cascade run` and `cascade link-flags`.

Artefacts:
  (default)         cargo build --release into $CARGO_TARGET_DIR (else ./target); cargo
                    rebuilds only what changed
  --target-dir DIR  the same with DIR as the cargo target directory
  --bin-dir DIR     take cascade, libcascade.so and libcascade_wrap.a from DIR as they are
                    (e.g. target/release of an earlier build); nothing is built
  --no-build        with the default or --target-dir: do not run cargo, use DIR/release

Options:
  --prefix PREFIX   where to install (default /usr/local); created if missing
  --help            this text

DESTDIR, if set, is put in front of every path written (for packaging); the files still
refer to PREFIX.
USAGE
}

die() {
    echo "install: $*" >&2
    exit 1
}

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=/usr/local
bin_dir=
target_dir=${CARGO_TARGET_DIR:-$repo/target}
build=yes

while [ $# -gt 0 ]; do
    case $1 in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --bin-dir) [ $# -ge 2 ] || die "--bin-dir needs a directory"; bin_dir=$2; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --target-dir) [ $# -ge 2 ] || die "--target-dir needs a directory"; target_dir=$2; shift 2 ;;
    --target-dir=*) target_dir=${1#*=}; shift ;;
    --no-build) build=no; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

case $prefix in
/*) ;;
*) die "--prefix must be an absolute path (the installed files refer to it): $prefix" ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || die "--prefix / is not supported; use /usr"

# cargo runs in the repository: a relative target directory means the caller's.
case $target_dir in
/*) ;;
*) target_dir=$PWD/$target_dir ;;
esac
if [ -z "$bin_dir" ]; then
    if [ "$build" = yes ]; then
        command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (scripts/test.sh does) or give --bin-dir"
        echo "install: cargo build --release (target directory $target_dir)"
        (cd "$repo" && CARGO_TARGET_DIR=$target_dir cargo build --release \
            -p cascade-cli -p cascade-preload -p cascade-wrap)
    fi
    bin_dir=$target_dir/release
fi
for artefact in cascade libcascade.so libcascade_wrap.a; do
    [ -f "$bin_dir/$artefact" ] || die "$bin_dir/$artefact is missing (build with 'cargo build --release -p cascade-cli -p cascade-preload -p cascade-wrap')"
done

dest=${DESTDIR:-}$prefix
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)
[ -n "$version" ] || die "no version in $repo/Cargo.toml"

echo "install: into $dest"
install -d "$dest/bin" "$dest/lib/pkgconfig" "$dest/include" \
    "$dest/share/cascade/systemd" "$dest/share/cascade/slurm" \
    "$dest/share/bash-completion/completions" "$dest/share/zsh/site-functions" \
    "$dest/share/fish/vendor_completions.d" "$dest/share/man/man1" \
    "$dest/share/doc/cascade"

install -m 755 "$bin_dir/cascade" "$dest/bin/cascade"
install -m 755 "$bin_dir/libcascade.so" "$dest/lib/libcascade.so"
install -m 644 "$bin_dir/libcascade_wrap.a" "$dest/lib/libcascade_wrap.a"
install -m 644 "$repo/include/cascade.h" "$dest/include/cascade.h"

# '|' as the separator: the prefix is a path.
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" \
    "$repo/contrib/pkgconfig/cascade.pc.in" >"$dest/lib/pkgconfig/cascade.pc"
chmod 644 "$dest/lib/pkgconfig/cascade.pc"

# The units and scripts name /usr/local/bin/cascade; point them at this prefix.
for file in "$repo"/contrib/systemd/* "$repo"/contrib/slurm/*; do
    kind=$(basename "$(dirname "$file")")
    mode=644
    [ -x "$file" ] && mode=755
    out="$dest/share/cascade/$kind/$(basename "$file")"
    sed "s|/usr/local/bin/cascade|$prefix/bin/cascade|g" "$file" >"$out"
    chmod "$mode" "$out"
done

# Completions and man pages from the installed binary's own clap definitions.
cascade=$dest/bin/cascade
"$cascade" completions bash >"$dest/share/bash-completion/completions/cascade"
"$cascade" completions zsh >"$dest/share/zsh/site-functions/_cascade"
"$cascade" completions fish >"$dest/share/fish/vendor_completions.d/cascade.fish"
"$cascade" man --out "$dest/share/man/man1" >/dev/null

install -m 644 "$repo/README.md" "$repo/LICENSE" "$dest/share/doc/cascade/"

echo "install: cascade $version installed in $dest"
case ":${PATH}:" in
*":$prefix/bin:"*) ;;
*) echo "install: $prefix/bin is not on PATH" ;;
esac
