#!/usr/bin/env python3
"""How soon a training job's DCP checkpoints are durable over a shaped 1 Gbit/s link (issue
23's benchmark, second half): a real training loop (an MLP and Adam, CPU) saves a series of
checkpoints with dcp.save into the node store (cascade.torch.Writer), and the agent drains
them to the S3 server behind the link (bench/netns-s3.sh), once with the plain layout and once
with dedup (chunks, zstd, deltas against the previous checkpoint). For each checkpoint: how
long dcp.save blocked, how long until `cascade.wait(..., level="durable")` returned (from the
start of the save), and what the host end of the link sent meanwhile; against the raw
minimum (the checkpoint's bytes at the link's rate). Then the last checkpoint is loaded in a
fresh store through read-through and compared bit for bit with the trained state. Run by
`bench/run.sh --suite dcp-durable` (root: network namespaces)."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from benchlib import machine

MODES = {
    "plain": {},
    # Dedup as the dedup-link suite runs it: content-defined chunks, zstd, deltas (on by
    # default with compression).
    "dedup": {"CASCADE_DEDUP": "cdc:avg=64KiB", "CASCADE_COMPRESS": "zstd:1"},
}


def link_tx(dev: str) -> int:
    with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
        return int(f.read())


def rate_bytes(rate: str) -> float:
    units = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8}
    for unit, mult in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult
    raise SystemExit(f"dcp_durable: link rate {rate!r}: expected NNgbit/mbit/kbit")


def model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 1024),
    )


def digest(sd: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        h.update(k.encode())
        h.update(v.numpy().tobytes() if isinstance(v, torch.Tensor) else repr(v).encode())
    return h.hexdigest()


def flat(state: dict) -> dict:
    """Model and optimizer tensors under dotted names: what DCP saves and loads."""
    out = {}

    def walk(prefix: str, v) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, torch.Tensor):
            out[prefix] = v
    walk("", state)
    return out


class Node:
    """A node store and its agent, draining to the job's place in the S3 store."""

    def __init__(self, cascade_bin: str, capacity: str, env: dict) -> None:
        self.bin = cascade_bin
        self.env = dict(env, CASCADE_STORE=f"/cascade-bench-dcpd-{uuid.uuid4().hex[:8]}")
        subprocess.run([self.bin, "init", "--capacity", capacity, "--spill-size", "0"], env=self.env,
                       check=True, capture_output=True)
        self.agent = subprocess.Popen([self.bin, "agent"], env=self.env, stderr=subprocess.PIPE, text=True)
        # Ready once it says so: read-through asks its control socket, which must exist.
        assert self.agent.stderr is not None
        for line in self.agent.stderr:
            if line.startswith("cascade agent: store "):
                break
        else:
            raise SystemExit(f"dcp_durable: the agent did not start (exit {self.agent.wait()})")
        threading.Thread(target=self.agent.stderr.read, daemon=True).start()
        # Attached once (each attach maps the whole store), with this node's settings only:
        # the durable store, layout and job namespace `wait` checks come from the environment.
        for key in [k for k in os.environ if k.startswith("CASCADE_") and not k.startswith("CASCADE_BENCH")]:
            del os.environ[key]
        os.environ.update(self.env)
        import cascade
        self.store = cascade.Store()

    def close(self) -> None:
        del self.store  # unmapped once collected: the store's memory is freed
        gc.collect()
        self.agent.terminate()
        self.agent.wait()
        subprocess.run([self.bin, "destroy", "--force"], env=self.env, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=4096, help="hidden width of the MLP (4096: ~38M parameters)")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps between checkpoints")
    ap.add_argument("--out", default="bench/results/dcp-durable.md")
    a = ap.parse_args()
    cascade_bin = os.environ.get("CASCADE_BIN", "cascade")
    url = os.environ["CASCADE_BENCH_S3_URL"]
    dev = os.environ["CASCADE_BENCH_LINK_DEV"]
    rate = os.environ["CASCADE_BENCH_LINK_RATE"]
    per_s = rate_bytes(rate)
    work = tempfile.mkdtemp(prefix="cascade-bench-dcpd-")
    open(os.path.join(work, "c.toml"), "w").close()
    run_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_") or k.startswith("CASCADE_BENCH")}
    base.update(CASCADE_CONFIG=os.path.join(work, "c.toml"), CASCADE_DURABLE=url, CASCADE_JOB=run_id)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from cascade.torch import Reader, Writer

    rows = {}
    final = {}
    for mode, settings in MODES.items():
        env = dict(base, CASCADE_JOB_NAME=f"dcpd-{mode}-{run_id}", **settings)
        net = model(a.width)
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)
        torch.manual_seed(1)
        node = Node(cascade_bin, "6GiB", env)
        rows[mode] = []
        try:
            for k in range(a.checkpoints):
                for _ in range(a.steps):
                    opt.zero_grad()
                    net(torch.randn(64, a.width)).pow(2).mean().backward()
                    opt.step()
                state = flat({"model": net.state_dict(), "optim": opt.state_dict()["state"]})
                nbytes = sum(t.numel() * t.element_size() for t in state.values())
                tx0, t0 = link_tx(dev), time.perf_counter()
                dcp.save(state, storage_writer=Writer(f"/train/ckpt.{k}", store=node.store))
                blocked = time.perf_counter() - t0
                node.store.wait(f"/train/ckpt.{k}", level="durable", timeout=900)
                durable = time.perf_counter() - t0
                rows[mode].append({"bytes": nbytes, "blocked": blocked, "durable": durable,
                                   "link": link_tx(dev) - tx0})
                print(f"{mode} ckpt.{k}: {nbytes} B, blocked {blocked:.2f} s, durable {durable:.2f} s, "
                      f"link {rows[mode][-1]['link']} B", file=sys.stderr, flush=True)
            final[mode] = (f"/train/ckpt.{a.checkpoints - 1}", digest(state),
                           {k: torch.zeros_like(v) for k, v in state.items()})
        finally:
            node.close()
        # Restart: a fresh store (another node) loads the last checkpoint through the agent.
        path, want, template = final[mode]
        fresh = Node(cascade_bin, "6GiB", env)
        try:
            t0 = time.perf_counter()
            dcp.load(template, storage_reader=Reader(path, store=fresh.store))
            load_s = time.perf_counter() - t0
        finally:
            fresh.close()
        if digest(template) != want:
            raise SystemExit(f"dcp_durable: {mode}: the checkpoint read back differs from the trained state")
        final[mode] = load_s
    dist.destroy_process_group()

    lines = [
        "# Time until a training job's DCP checkpoints are durable over a 1 Gbit/s link",
        "",
        f"{machine()}, torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"`bench/run.sh --suite dcp-durable` (bench/python/dcp_durable.py). An MLP of width {a.width} and "
        f"Adam trained on CPU, {a.steps} steps between checkpoints, {a.checkpoints} checkpoints saved with "
        f"`dcp.save(..., storage_writer=cascade.torch.Writer(...))`; the agent drains to versitygw (S3) behind "
        f"tc tbf at {rate} (bench/netns-s3.sh). Plain: the agent's plain layout. Dedup: "
        f"`CASCADE_DEDUP=cdc:avg=64KiB CASCADE_COMPRESS=zstd:1` (deltas against the previous checkpoint on, "
        f"the default with compression). Each save starts once the previous checkpoint is durable. "
        f"**blocked**: how long dcp.save blocked; **durable**: from the start of the save until "
        f"`cascade.wait(..., level=\"durable\")` returned; **link**: bytes the host end of the link sent "
        f"meanwhile; **raw minimum**: the checkpoint's bytes at the link's rate. The last checkpoint of each "
        f"mode was then loaded in a fresh store through read-through and matched the trained state bit for bit "
        f"(plain {final['plain']:.2f} s, dedup {final['dedup']:.2f} s).",
        "",
        "| checkpoint | bytes | raw minimum s | plain blocked s | plain durable s | dedup blocked s | dedup durable s "
        "| dedup durable / raw minimum | link plain B | link dedup B |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    total = {m: {"blocked": 0.0, "durable": 0.0, "link": 0} for m in MODES}
    raw_total = 0.0
    nbytes_total = 0
    for k in range(a.checkpoints):
        p, d = rows["plain"][k], rows["dedup"][k]
        raw = p["bytes"] / per_s
        raw_total += raw
        nbytes_total += p["bytes"]
        for m, r in (("plain", p), ("dedup", d)):
            for f in ("blocked", "durable", "link"):
                total[m][f] += r[f]
        lines.append(f"| ckpt.{k} | {p['bytes']} | {raw:.2f} | {p['blocked']:.2f} | {p['durable']:.2f} | "
                     f"{d['blocked']:.2f} | {d['durable']:.2f} | {d['durable'] / raw:.2f}x | {p['link']} | {d['link']} |")
    tp, td = total["plain"], total["dedup"]
    lines.append(f"| **series** | {nbytes_total} | {raw_total:.2f} | {tp['blocked']:.2f} | {tp['durable']:.2f} | "
                 f"{td['blocked']:.2f} | {td['durable']:.2f} | {td['durable'] / raw_total:.2f}x | {tp['link']} | {td['link']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    open(a.out, "w").write(text)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"rows": rows, "raw_per_s": per_s, "load_s": final}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
