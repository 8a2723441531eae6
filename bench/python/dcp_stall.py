#!/usr/bin/env python3
"""How long torch.distributed.checkpoint blocks a training loop (issue 23's benchmark, first
part): dcp.save and dcp.async_save of a ~1 GB state dict with Cascade's writer (into the node
store, committed, an agent draining it to a directory on local disk) against torch's own
FileSystemWriter to a local-disk directory and to /dev/shm, in the same run, alternating,
each repeated. Prints a markdown table (median [min-max] seconds and the ratios) and writes
it to --out. Run by bench/run.sh --suite dcp; needs torch 2.x, the `cascade` package and the
`cascade` binary (CASCADE_BIN)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from benchlib import machine


def state_dict(total_mib: int) -> dict:
    torch.manual_seed(0)
    n = max(1, total_mib // 4)
    return {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(n)}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="size of the state dict (MiB)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--disk", default="/var/tmp", help="local-disk directory for the baseline")
    ap.add_argument("--out", default="bench/results/dcp.md")
    a = ap.parse_args()
    cascade_bin = os.environ.get("CASCADE_BIN", "cascade")
    name = f"/cascade-bench-dcp-{os.getpid()}"
    work = tempfile.mkdtemp(dir=a.disk, prefix="cascade-bench-dcp-")
    env = dict(os.environ, CASCADE_STORE=name, CASCADE_CONFIG=os.path.join(work, "c.toml"),
               CASCADE_DURABLE=os.path.join(work, "durable"))
    open(env["CASCADE_CONFIG"], "w").close()
    os.makedirs(env["CASCADE_DURABLE"])
    os.environ.update({k: env[k] for k in ("CASCADE_STORE", "CASCADE_CONFIG", "CASCADE_DURABLE")})
    # Retention (keep 2) evicts each checkpoint once two newer ones are durable, and every
    # save starts once the previous one is durable: room for four, whatever --reps.
    capacity = f"{a.mib * 4 + 1024}MiB"
    subprocess.run([cascade_bin, "init", "--capacity", capacity, "--spill-size", "0"], check=True,
                   env=env, capture_output=True)
    agent = subprocess.Popen([cascade_bin, "agent"], env=env, stderr=subprocess.DEVNULL)
    import cascade
    from cascade.torch import Writer

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    sd = state_dict(a.mib)
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="cascade-bench-dcp-")
    def settle(kind: str, tag: str) -> None:
        """The next timed save starts once Cascade's last checkpoint is durable, as in a
        training loop that checkpoints less often than the drain takes (here 1 GiB to local
        disk, about a second), and once torch's files are on disk: no writer's background
        work competes with the next one's blocking time on this machine's cores."""
        if kind == "cascade":
            cascade.wait(f"/dcp/{tag}", level="durable", timeout=600)
        else:
            os.sync()

    rows = {k: [] for k in ("cascade save", "disk save", "shm save",
                            "cascade async", "disk async", "shm async")}
    try:
        # The first save and async_save of a process set up planners and async_save's
        # executor: done once, untimed, so it is charged to no writer.
        dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(shm, "warm")))
        dcp.async_save(sd, storage_writer=FileSystemWriter(os.path.join(shm, "warm-a"))).result()
        # And one into the store: the first write of a process maps the store's pages into
        # it in the background (about 0.3 s of CPU per GiB of store, docs/store-layout.md),
        # a job's first checkpoint, not its steady state (issue 24 measures that one).
        dcp.save(sd, storage_writer=Writer("/dcp/warm"))
        cascade.wait("/dcp/warm", level="durable", timeout=600)
        shutil.rmtree(os.path.join(shm, "warm"), ignore_errors=True)
        shutil.rmtree(os.path.join(shm, "warm-a"), ignore_errors=True)
        for r in range(a.reps):
            targets = [("cascade", lambda tag: Writer(f"/dcp/{tag}")),
                       ("disk", lambda tag: FileSystemWriter(os.path.join(work, tag))),
                       ("shm", lambda tag: FileSystemWriter(os.path.join(shm, tag)))]
            if r % 2:
                targets.reverse()
            for kind, make in targets:
                rows[f"{kind} save"].append(timed(lambda: dcp.save(sd, storage_writer=make(f"s{r}"))))
                settle(kind, f"s{r}")
                futures = []
                rows[f"{kind} async"].append(timed(lambda: futures.append(
                    dcp.async_save(sd, storage_writer=make(f"a{r}")))))
                futures[0].result()
                settle(kind, f"a{r}")
            for tag in (f"s{r}", f"a{r}"):
                shutil.rmtree(os.path.join(work, tag), ignore_errors=True)
                shutil.rmtree(os.path.join(shm, tag), ignore_errors=True)
    finally:
        dist.destroy_process_group()
        agent.terminate()
        agent.wait()
        subprocess.run([cascade_bin, "destroy", "--force"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    def med(k):
        v = rows[k]
        return statistics.median(v), min(v), max(v)

    lines = [
        "# torch.distributed.checkpoint: how long the training loop is blocked",
        "",
        f"{machine()}, torch {torch.__version__}; "
        f"{a.mib} MiB state dict ({a.mib // 4} tensors of 4 MiB), {a.reps} repetitions alternating the order, after an untimed warm-up save of each kind; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. `bench/python/dcp_stall.py`.",
        "",
        "| writer | dcp.save s (median [min-max]) | dcp.async_save blocking s | save vs Cascade | async vs Cascade |",
        "|---|---|---|---|---|",
    ]
    cs, ca = med("cascade save")[0], med("cascade async")[0]
    for kind, label in (("cascade", "Cascade (node store, committed, agent draining)"),
                        ("disk", f"FileSystemWriter to local disk ({a.disk})"),
                        ("shm", "FileSystemWriter to /dev/shm")):
        s, a_ = med(f"{kind} save"), med(f"{kind} async")
        lines.append(f"| {label} | {s[0]:.2f} [{s[1]:.2f}-{s[2]:.2f}] | {a_[0]:.2f} [{a_[1]:.2f}-{a_[2]:.2f}] "
                     f"| {s[0] / cs:.2f}x | {a_[0] / ca:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    open(a.out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
