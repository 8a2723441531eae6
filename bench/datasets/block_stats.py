#!/usr/bin/env python3
"""Quick sanity statistics of a checkpoint series made by make.sh.

usage: block_stats.py SERIES_DIR [SERIES_DIR...]   (e.g. /var/tmp/cascade-datasets/torch)

For each pair of consecutive snapshots (snap-NN and snap-NN+1) it splits every file into
4 KiB blocks and prints the fraction of the newer snapshot's blocks that are identical
(SHA-1) to the block at the same offset of the same file in the older one ("same offset"),
and to any block of the older snapshot ("anywhere"). It then compresses one snapshot (the
middle one) with zlib level 1 and, when the zstd command is present, zstd -3, and prints the
ratios (input bytes / compressed bytes).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import zlib

BLOCK = 4096


def snapshots(series_dir):
    return sorted(
        os.path.join(series_dir, d)
        for d in os.listdir(series_dir)
        if d.startswith("snap-") and os.path.isdir(os.path.join(series_dir, d))
    )


def files(snap):
    out = []
    for root, _, names in os.walk(snap):
        for name in names:
            path = os.path.join(root, name)
            out.append(os.path.relpath(path, snap))
    return sorted(out)


def block_hashes(path):
    hashes = []
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                return hashes
            hashes.append(hashlib.sha1(block).digest())


def snapshot_hashes(snap):
    return {rel: block_hashes(os.path.join(snap, rel)) for rel in files(snap)}


def compression(snap):
    raw = 0
    z1 = 0
    for rel in files(snap):
        with open(os.path.join(snap, rel), "rb") as f:
            data = f.read()
        raw += len(data)
        z1 += len(zlib.compress(data, 1))
    result = {"zlib-1": raw / z1}
    if shutil.which("zstd"):
        zs = 0
        for rel in files(snap):
            out = subprocess.run(
                ["zstd", "-3", "-q", "-c", os.path.join(snap, rel)],
                check=True,
                stdout=subprocess.PIPE,
            ).stdout
            zs += len(out)
        result["zstd-3"] = raw / zs
    return raw, result


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for series_dir in sys.argv[1:]:
        name = os.path.basename(os.path.normpath(series_dir))
        snaps = snapshots(series_dir)
        if not snaps:
            sys.exit(f"block_stats: no snap-NN directories in {series_dir}")
        prev = None
        fractions = []
        print(f"== {name}: {len(snaps)} snapshots")
        for snap in snaps:
            cur = snapshot_hashes(snap)
            if prev is not None:
                total = sum(len(h) for h in cur.values())
                same = 0
                anywhere = 0
                prev_set = {h for hs in prev.values() for h in hs}
                for rel, hs in cur.items():
                    old = prev.get(rel, [])
                    same += sum(1 for i, h in enumerate(hs) if i < len(old) and old[i] == h)
                    anywhere += sum(1 for h in hs if h in prev_set)
                fractions.append(same / total)
                print(
                    f"{name} {os.path.basename(snap)}: {total} blocks, "
                    f"same offset {same / total * 100:.1f}%, anywhere {anywhere / total * 100:.1f}%"
                )
            prev = cur
        if fractions:
            print(
                f"{name}: same-offset 4 KiB blocks between consecutive snapshots: "
                f"min {min(fractions) * 100:.1f}% mean {sum(fractions) / len(fractions) * 100:.1f}% "
                f"max {max(fractions) * 100:.1f}%"
            )
        mid = snaps[len(snaps) // 2]
        raw, ratios = compression(mid)
        print(
            f"{name} {os.path.basename(mid)} ({raw} bytes) compression: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        )


if __name__ == "__main__":
    main()
