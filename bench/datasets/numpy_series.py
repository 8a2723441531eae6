#!/usr/bin/env python3
"""numpy checkpoint series: a 2-D heat-diffusion simulation on an N x N float64 grid.

Explicit 5-point stencil (alpha 0.24). The left edge and three heater plates are held at
1.0 (a static region of the state), 40 circular obstacles at 0.0 (static), everything else
starts at 0.0 and warms up as the heat spreads; far from the heat sources the grid stays
exactly 0.0 until the front reaches it. Every K steps it writes SERIES_DIR/snap-NN/ with
  state.npy  np.save of the N x N float64 temperature (32 MiB at N = 2048)
  mask.npy   np.save of the N x N uint8 cell kinds (0 fluid, 1 obstacle, 2 heater): static
  meta.json  step, time, grid size, parameters and a few statistics
Deterministic (no randomness beyond a seeded generator for the obstacle layout).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

CONFIGS = {
    "full": dict(n=2048, every=100, snapshots=8),
    "quick": dict(n=512, every=25, snapshots=3),
}
ALPHA = 0.24


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series_dir")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = CONFIGS["quick" if args.quick else "full"]
    n = cfg["n"]

    rng = np.random.default_rng(42)
    yy, xx = np.mgrid[0:n, 0:n]
    kind = np.zeros((n, n), dtype=np.uint8)
    for _ in range(40):
        cy, cx = rng.integers(0, n, size=2)
        r = rng.integers(n // 128, n // 32)
        kind[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = 1
    for y0, x0, h, w in ((0.2, 0.3, 0.05, 0.2), (0.6, 0.55, 0.1, 0.04), (0.85, 0.15, 0.03, 0.1)):
        kind[int(y0 * n) : int((y0 + h) * n), int(x0 * n) : int((x0 + w) * n)] = 2
    kind[:, 0] = 2
    del yy, xx

    fixed = kind != 0
    fixed_value = np.where(kind == 2, 1.0, 0.0)
    u = np.zeros((n, n), dtype=np.float64)
    np.copyto(u, fixed_value, where=fixed)

    step = 0
    t0 = time.monotonic()
    for snap_no in range(cfg["snapshots"]):
        ts = time.monotonic()
        for _ in range(cfg["every"]):
            c = u[1:-1, 1:-1]
            lap = u[:-2, 1:-1] + u[2:, 1:-1]
            lap += u[1:-1, :-2]
            lap += u[1:-1, 2:]
            lap -= 4.0 * c
            lap *= ALPHA
            c += lap
            np.copyto(u, fixed_value, where=fixed)
            step += 1
        snap = os.path.join(args.series_dir, f"snap-{snap_no:02d}")
        os.makedirs(snap, exist_ok=True)
        np.save(os.path.join(snap, "state.npy"), u)
        np.save(os.path.join(snap, "mask.npy"), kind)
        meta = {
            "step": step,
            "time": step * 1.0e-3,
            "grid": [n, n],
            "alpha": ALPHA,
            "checkpoint_every": cfg["every"],
            "heat_total": float(u.sum()),
            "max_fluid": float(u[~fixed].max()),
            "nonzero_cells": int(np.count_nonzero(u)),
        }
        with open(os.path.join(snap, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
        print(
            f"numpy: step {step} nonzero cells {meta['nonzero_cells'] / n / n * 100:.1f}% "
            f"{time.monotonic() - ts:.1f} s",
            file=sys.stderr,
        )
    print(f"numpy: {step} steps in {time.monotonic() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
