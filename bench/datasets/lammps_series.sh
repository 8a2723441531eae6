#!/usr/bin/env bash
# LAMMPS checkpoint series: the Lennard-Jones melt of LAMMPS's examples/melt (fcc lattice at
# reduced density 0.8442, T 3.0, lj/cut 2.5, NVE), scaled to 45^3 unit cells (364,500 atoms,
# a binary restart of about 32 MB; --quick: 20^3 cells, 32,000 atoms, 2.8 MB), run serially
# by Debian's `lmp` (package lammps). `restart N` writes a binary restart file every N steps;
# each goes to SERIES_DIR/snap-NN/melt.restart, in order. The input script and the LAMMPS log
# stay in SERIES_DIR. Deterministic: a rerun writes the same bytes.
#
# usage: lammps_series.sh [--quick] SERIES_DIR
set -euo pipefail

cells=45 every=50 snapshots=8
if [ "${1:-}" = "--quick" ]; then
    cells=20 every=25 snapshots=3
    shift
fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--quick] SERIES_DIR" >&2
    exit 2
fi
dir=$1
lmp=$(command -v lmp || command -v lmp_serial || true)
if [ -z "$lmp" ]; then
    echo "lammps_series: no lmp or lmp_serial on PATH (Debian package lammps)" >&2
    exit 1
fi
mkdir -p "$dir"
cd "$dir"

cat >in.melt <<EOF
# 3d Lennard-Jones melt (LAMMPS examples/melt), ${cells}^3 fcc unit cells
units           lj
atom_style      atomic
lattice         fcc 0.8442
region          box block 0 ${cells} 0 ${cells} 0 ${cells}
create_box      1 box
create_atoms    1 box
mass            1 1.0
velocity        all create 3.0 87287 loop geom
pair_style      lj/cut 2.5
pair_coeff      1 1 1.0 1.0 2.5
neighbor        0.3 bin
neigh_modify    every 20 delay 0 check no
fix             1 all nve
thermo          ${every}
restart         ${every} melt.*.restart
run             $((every * snapshots))
EOF

rm -f melt.*.restart
"$lmp" -in in.melt -log log.lammps -screen none -nocite

n=0
for step in $(seq "$every" "$every" $((every * snapshots))); do
    snap=$(printf 'snap-%02d' "$n")
    mkdir -p "$snap"
    mv "melt.$step.restart" "$snap/melt.restart"
    n=$((n + 1))
done
