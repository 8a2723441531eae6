#!/usr/bin/env bash
# Installs what the tests need (only what is missing) and runs every check and test in the
# workspace: rustfmt, clippy with warnings as errors, and all unit, integration,
# multi-process and C-example tests.
#
# Tests run in the debug profile: overflow checks and debug assertions stay on, which is
# what a test of crash-consistency invariants wants, and it builds faster than release.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

packages=(build-essential pkg-config python3)
# The Python package's tests run in a venv of Debian's python (python/tests, below).
packages+=(python3-venv)
# Real programs the interposition tests run (crates/cascade-preload/tests/programs*.rs).
packages+=(rsync fio gfortran python3-numpy python3-h5py openmpi-bin libopenmpi-dev)
# GROMACS (solvate, grompp, mdrun and a restart) in crates/cascade-preload/tests/libc_paths.rs.
packages+=(gromacs)
# The durability test checks the real fsync order of a drain under strace
# (crates/cascade-durable/tests/durability.rs).
packages+=(strace)
# A real Prometheus scrapes the agent's and a staging server's --metrics, and promtool checks
# the example alert rules (crates/cascade-cli/tests/observe.rs, docs/operations.md).
packages+=(prometheus)
# Real programs that generate the checkpoint series of bench/datasets/make.sh.
packages+=(python3-torch lammps)
# `cascade check-binary` is tested on a Go program built with `go build`; Go may come from
# Debian or from a Go distribution in /usr/local/go.
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
    packages+=(golang-go)
fi
if ! command -v cargo >/dev/null 2>&1; then
    packages+=(curl ca-certificates) # for rustup
fi
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "test: installing ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    # The downloaded .deb files (about 1 GB) are not needed once installed.
    as_root apt-get clean
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "test: installing Rust with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y --profile minimal --component rustfmt,clippy
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done

# The S3 tests of crates/cascade-durable run a real S3-compatible server, versitygw, built
# from the Go module proxy (about 90 s on 2 cores). The test looks for it on $PATH, in $GOBIN,
# in $(go env GOPATH)/bin and in ~/go/bin.
if ! command -v versitygw >/dev/null 2>&1; then
    export PATH="$PATH:/usr/local/go/bin"
    gobin="${GOBIN:-$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin}"
    if [ ! -x "$gobin/versitygw" ]; then
        echo "test: installing versitygw into $gobin"
        # Its modules and build cache (about 1 GB) go into a directory of their own, removed
        # after the build: neither the disk nor a Go developer's own caches keep them.
        gowork="$(mktemp -d)"
        GOBIN="$gobin" GOCACHE="$gowork/cache" GOMODCACHE="$gowork/mod" \
            go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
        GOMODCACHE="$gowork/mod" go clean -modcache
        rm -rf "$gowork"
    fi
    export PATH="$PATH:$gobin"
fi

# Disk: a clean clone needs about 10 GB on the target directory's disk at its peak, and CI
# machines have run out. Cargo's incremental cache (2.5 GB) is no use to a single build, and
# the torch venv below is installed before cargo builds, so that pip's 3 GB of downloaded
# wheels are gone again by then.
export CARGO_INCREMENTAL=0
target="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$target"
free_gb=$(($(df -k --output=avail "$target" | tail -1) / 1024 / 1024))
echo "test: $free_gb GB free on the disk of $target"
if [ ! -x "$target/python-venv-torch2/bin/python" ] && [ "$free_gb" -lt 10 ]; then
    echo "test: warning: a first run needs about 10 GB free there (README.md); it may fail with 'No space left on device'" >&2
fi

# A venv with a current torch (about 40 s and 4.5 GB the first time; kept in the target
# directory), where every Python test runs: torch.save/load, dcp.save/async_save/load, fsspec
# (the package itself is installed into it after cargo test, below). torch is pinned to the
# release last tested, so that a new one changes CI only when we move the pin.
torch_release=2.15.0
torch2="$target/python-venv-torch2"
if [ ! -x "$torch2/bin/python" ]; then
    /usr/bin/python3 -m venv "$torch2"
fi
if ! [ -x "$torch2/bin/maturin" ] || ! "$torch2/bin/python" -c "import numpy, fsspec, pytest, torch
assert torch.__version__.split('+')[0] == '$torch_release'" 2>/dev/null; then
    # --no-cache-dir: pip's cache would keep another 3 GB of wheels beside the installed ones.
    "$torch2/bin/python" -m pip install -q --no-cache-dir maturin pytest fsspec numpy "torch==$torch_release"
    # triton (1 GB) serves torch.compile on GPUs only; nothing here uses it.
    "$torch2/bin/python" -m pip uninstall -q -y triton
fi

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace --no-fail-fast

# The Python package (python/, docs/python.md): installed with pip into a venv of Debian's
# python that sees its numpy and torch (--system-site-packages), then its tests against a
# real store, the `cascade` binary cargo test built and a real agent. maturin builds the
# extension in the debug profile here (MATURIN_PEP517_ARGS), reusing what cargo test built;
# the build runs without isolation, with the venv's maturin.
echo "== python: pip install ./python, pytest python/tests"
venv="$target/python-venv"
if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install -q maturin pytest fsspec
# The venv's bin on PATH: maturin's build hook runs the `maturin` program.
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python
# Debian's torch 1.13 cannot import its distributed checkpoint module on Python 3.11
# (torch.distributed._shard fails with a dataclass error): the DCP tests (torch2/) run in
# the venv with torch 2.x from the package registry, installed at the start.
CASCADE_BIN="$target/debug/cascade" "$venv/bin/python" -m pytest -q python/tests --ignore=python/tests/torch2
PATH="$torch2/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" "$torch2/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python
CASCADE_BIN="$target/debug/cascade" "$torch2/bin/python" -m pytest -q -W ignore::UserWarning python/tests
# And into a plain venv (no system site packages: no numpy, no torch), where it must import.
plain="$target/python-venv-plain"
if [ ! -x "$plain/bin/python" ]; then
    /usr/bin/python3 -m venv "$plain"
fi
"$plain/bin/python" -m pip install -q maturin
PATH="$plain/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" "$plain/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./python
"$plain/bin/python" -c 'import cascade, sys; assert "torch" not in sys.modules; print("python: import cascade in a plain venv: ok")'
