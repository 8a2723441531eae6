#!/usr/bin/env python3
"""How soon a training job's DCP checkpoints are durable over a shaped 1 Gbit/s link (issue
23's benchmark, second half): a real training loop (an MLP and Adam on CPU, about 1 GB of
state dict) saves a series of checkpoints with dcp.save into the node store
(cascade.torch.Writer), and the agent drains them to the S3 server behind the link
(bench/netns-s3.sh): with the plain layout, with the agent's default dedup (the default
chunking, every other dedup setting at its default) and with dedup plus zstd (which makes the
default-on deltas take effect). Against torch's own FsspecWriter (s3fs) saving straight to the
same S3 server over the same link, and the raw minimum (the checkpoint's bytes at the link's
rate). For each checkpoint: how long dcp.save blocked, how long until the checkpoint was
durable (from the start of the save), what the host end of the link sent meanwhile. Then the
last checkpoint of each mode is loaded from the durable store (a fresh node store reading
through) and compared bit for bit with the trained state. Every mode trains the same series
from the same seeds, into its own fresh store and its own S3 prefix. Run by `bench/run.sh
--suite dcp-durable` (root: network namespaces)."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FsspecReader, FsspecWriter

from benchlib import machine

# The Cascade modes: the agent's settings (environment) for each.
CASCADE_MODES: dict[str, dict[str, str]] = {
    "plain": {},
    # dedup.chunking's default when switched on (Chunking::DEFAULT_CDC); dedup.compress stays
    # at its default, off, and deltas (dedup.delta, on) take effect only with compression.
    "dedup": {"CASCADE_DEDUP": "on"},
    "dedup+zstd": {"CASCADE_DEDUP": "cdc:avg=64KiB", "CASCADE_COMPRESS": "zstd:1"},
}
DIRECT = "s3fs direct"
MODES = [*CASCADE_MODES, DIRECT]
LABELS = {
    "plain": "Cascade, plain layout",
    "dedup": "Cascade, default dedup (`CASCADE_DEDUP=on`: fixed 64 KiB chunks, adaptive zstd, deltas)",
    "dedup+zstd": "Cascade, dedup + `CASCADE_COMPRESS=zstd:1` (deltas)",
    DIRECT: "torch FsspecWriter (s3fs) straight to S3",
}


def link_bytes(dev: str, direction: str) -> int:
    """A byte counter (tx or rx) of a network device."""
    with open(f"/sys/class/net/{dev}/statistics/{direction}_bytes") as f:
        return int(f.read())


def rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate such as 1gbit."""
    units = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8}
    for unit, mult in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult
    raise SystemExit(f"dcp_durable: link rate {rate!r}: expected NNgbit/mbit/kbit")


def shaping(dev: str) -> str:
    """The host end's qdisc as tc prints it (rate, burst, latency)."""
    out = subprocess.run(["tc", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
    m = re.search(r"(tbf) .*?(rate \S+ burst \S+ lat \S+)", out)
    return " ".join(m.groups()) if m else " ".join(out.split()) or "unknown"


def model(width: int) -> torch.nn.Module:
    """The MLP, its weights from a fixed seed: 2 width^2 + 1025 width + 1024 parameters."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 1024),
    )


def flat(state: dict) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors under dotted names: what DCP saves and loads."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, torch.Tensor):
            out[prefix] = v
    walk("", state)
    return out


def series(width: int, steps: int, checkpoints: int) -> Iterator[dict[str, torch.Tensor]]:
    """Trains and yields the state dict to save every `steps` Adam steps; the same series in
    every mode (fixed seeds). The caller saves it before asking for the next."""
    net = model(width)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    torch.manual_seed(1)
    for _ in range(checkpoints):
        for _ in range(steps):
            opt.zero_grad()
            net(torch.randn(64, width)).pow(2).mean().backward()
            opt.step()
        yield flat({"model": net.state_dict(), "optim": opt.state_dict()["state"]})


def digest(sd: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes: equal digests mean bit-identical state dicts."""
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Node:
    """A node store and its agent, draining to the mode's place in the S3 store."""

    def __init__(self, cascade_bin: str, capacity: str, env: dict[str, str]) -> None:
        self.bin = cascade_bin
        # Named after the run (run.sh's pid), whose exit trap destroys what an interrupted
        # run left behind.
        run = os.environ.get("CASCADE_BENCH_RUN", str(os.getpid()))
        self.env = dict(env, CASCADE_STORE=f"/cascade-bench-dcpd-{run}-{uuid.uuid4().hex[:8]}")
        subprocess.run([self.bin, "init", "--capacity", capacity, "--spill-size", "0"], env=self.env,
                       check=True, capture_output=True)
        self.agent = subprocess.Popen([self.bin, "agent"], env=self.env, stderr=subprocess.PIPE, text=True)
        # Ready once it says so: read-through asks its control socket, which must exist.
        assert self.agent.stderr is not None
        for line in self.agent.stderr:
            # After the log line's timestamp and level (docs/operations.md).
            if "cascade agent: store " in line:
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
        """Stops the agent and destroys the store."""
        del self.store  # unmapped once collected: the store's memory is freed
        gc.collect()
        self.agent.terminate()
        self.agent.wait()
        subprocess.run([self.bin, "destroy", "--force"], env=self.env, capture_output=True)


def measure(dev: str, save: Callable[[], None], wait: Callable[[], None]) -> dict[str, float]:
    """Times one checkpoint: save (blocking), then wait until durable; the link's tx bytes."""
    tx0, t0 = link_bytes(dev, "tx"), time.perf_counter()
    save()
    blocked = time.perf_counter() - t0
    wait()
    durable = time.perf_counter() - t0
    return {"blocked": blocked, "durable": durable, "link": link_bytes(dev, "tx") - tx0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=6400,
                    help="hidden width of the MLP (6400: 88.5M parameters, 1.06 GB with Adam's state)")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps between checkpoints")
    ap.add_argument("--out", default="bench/results/dcp-durable.md")
    a = ap.parse_args()
    command = shlex.join(["bench/run.sh", "--suite", "dcp-durable", *sys.argv[1:]])
    cascade_bin = os.environ.get("CASCADE_BIN", "cascade")
    endpoint = os.environ["CASCADE_BENCH_S3_ENDPOINT"]
    bucket = os.environ["CASCADE_BENCH_S3_BUCKET"]
    access, secret = os.environ["CASCADE_BENCH_S3_ACCESS_KEY"], os.environ["CASCADE_BENCH_S3_SECRET_KEY"]
    dev = os.environ["CASCADE_BENCH_LINK_DEV"]
    per_s = rate_bytes(os.environ["CASCADE_BENCH_LINK_RATE"])
    link = shaping(dev)
    load0 = os.getloadavg()[0]
    started = time.time()
    work = tempfile.mkdtemp(prefix="cascade-bench-dcpd-")
    open(os.path.join(work, "c.toml"), "w").close()
    run_id = f"dcpd-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_") or k.startswith("CASCADE_BENCH")}
    base.update(CASCADE_CONFIG=os.path.join(work, "c.toml"), CASCADE_JOB=run_id)
    s3opts = {"key": access, "secret": secret, "endpoint_url": endpoint}
    import s3fs
    s3 = s3fs.S3FileSystem(**s3opts)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from cascade.torch import Reader, Writer

    rows: dict[str, list[dict[str, float]]] = {}
    nbytes: list[int] = []
    verify: dict[str, dict[str, float]] = {}
    for mode in MODES:
        # Its own prefix in the bucket: a repository (or objects) of its own, nothing to
        # dedup against from another mode (which trained the same series).
        prefix = f"{bucket}/{run_id}/{mode.replace(' ', '-')}"
        url = (f"s3://{prefix}?endpoint={endpoint}&access_key={access}&secret_key={secret}")
        env = dict(base, CASCADE_DURABLE=url, CASCADE_JOB_NAME=f"{run_id}-{mode}", **CASCADE_MODES.get(mode, {}))
        # Retention keeps two checkpoints (each evicted once two newer are durable): room for
        # three of ~1 GB and the deltas' base.
        node = Node(cascade_bin, "5GiB", env) if mode != DIRECT else None
        rows[mode] = []
        try:
            for k, state in enumerate(series(a.width, a.steps, a.checkpoints)):
                if mode == MODES[0]:
                    nbytes.append(sum(t.numel() * t.element_size() for t in state.values()))
                if node is not None:
                    path = f"/train/ckpt.{k}"
                    r = measure(dev, lambda: dcp.save(state, storage_writer=Writer(path, store=node.store)),
                                lambda: node.store.wait(path, level="durable", timeout=900))
                else:
                    path = f"s3://{prefix}/train/ckpt.{k}"
                    # Its save returns once every object is uploaded: durable when it returns.
                    r = measure(dev, lambda: dcp.save(state, storage_writer=FsspecWriter(path, **s3opts)),
                                lambda: None)
                rows[mode].append(r)
                print(f"{mode} ckpt.{k}: {nbytes[k]} B, blocked {r['blocked']:.2f} s, "
                      f"durable {r['durable']:.2f} s, link {r['link']} B", file=sys.stderr, flush=True)
            want = digest(state)
            template = {k: torch.zeros_like(v) for k, v in state.items()}
            del state
        finally:
            if node is not None:
                node.close()
        # Restart: a fresh node store (another node) loads the last checkpoint, read through
        # from the durable store; the direct baseline reads it back from S3 with s3fs.
        last = a.checkpoints - 1
        fresh = Node(cascade_bin, "3GiB", env) if mode != DIRECT else None
        rx0, t0 = link_bytes(dev, "rx"), time.perf_counter()
        try:
            if fresh is not None:
                dcp.load(template, storage_reader=Reader(f"/train/ckpt.{last}", store=fresh.store))
            else:
                dcp.load(template, storage_reader=FsspecReader(f"s3://{prefix}/train/ckpt.{last}", **s3opts))
        finally:
            if fresh is not None:
                fresh.close()
        load_s, load_rx = time.perf_counter() - t0, link_bytes(dev, "rx") - rx0
        if digest(template) != want:
            raise SystemExit(f"dcp_durable: {mode}: ckpt.{last} read back from the durable store differs "
                             f"from the trained state")
        del template
        s3.invalidate_cache()
        stored = s3.du(prefix)
        verify[mode] = {"load_s": load_s, "load_link_rx": load_rx, "stored": stored}
        print(f"{mode}: ckpt.{last} read back bit-identical in {load_s:.2f} s ({load_rx} B over the link); "
              f"{stored} B in the durable store", file=sys.stderr, flush=True)
        s3.rm(prefix, recursive=True)  # the server's disk: five ~1 GB checkpoints per mode
    dist.destroy_process_group()
    shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - started

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}x" if y else "-"

    raw = [n / per_s for n in nbytes]
    lines = [
        "# Time until a training job's DCP checkpoints are durable over a 1 Gbit/s link",
        "",
        f"{machine()}, torch {torch.__version__}; link: `tc {link}` on the host end of the veth to "
        f"versitygw (S3) in a network namespace (bench/netns-s3.sh); "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, load average {load0:.2f} at the start, "
        f"{elapsed / 60:.1f} min; `{command}` (bench/python/dcp_durable.py).",
        "",
        f"A real training loop: an MLP of width {a.width} ({sum(p.numel() for p in model(a.width).parameters()) / 1e6:.1f}M "
        f"fp32 parameters) and Adam on CPU, {a.steps} optimizer steps before each of {a.checkpoints} checkpoints "
        f"(parameters and Adam's state: {nbytes[0] / 1e9:.2f} GB each). Cascade modes save with "
        f"`dcp.save(state_dict, storage_writer=cascade.torch.Writer(path))` into a node store whose agent drains "
        f"to S3; the baseline saves with torch's `FsspecWriter` (s3fs) straight to S3 over the same link. Every mode "
        f"trains the same series (fixed seeds) into a fresh store and its own S3 prefix. **Each checkpoint is durable "
        f"before training goes on to the next.** **blocked**: how long dcp.save blocked the loop; **durable**: from "
        f"the start of the save until `cascade.wait(path, level=\"durable\")` returned (the baseline: until its "
        f"dcp.save returned); **on the link**: bytes the host end of the link sent meanwhile (tx_bytes, headers "
        f"included); **raw minimum**: the checkpoint's bytes at the link's nominal rate. vs S3 direct and vs raw "
        f"minimum: the durable time's ratios. Default dedup is the default chunking with every other dedup setting "
        f"at its default: compression off, so the deltas (on by default) do not take effect; dedup + zstd turns "
        f"them on.",
        "",
        "| checkpoint | bytes | raw minimum s | mode | blocked s | durable s | on the link B | durable vs S3 direct "
        "| durable vs raw minimum |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in range(a.checkpoints):
        for mode in MODES:
            r = rows[mode][k]
            lines.append(f"| ckpt.{k} | {nbytes[k]} | {raw[k]:.2f} | {mode} | {r['blocked']:.2f} | {r['durable']:.2f} "
                         f"| {r['link']} | {ratio(r['durable'], rows[DIRECT][k]['durable'])} | {ratio(r['durable'], raw[k])} |")
    totals = {m: {f: sum(r[f] for r in rows[m]) for f in ("blocked", "durable", "link")} for m in MODES}
    for mode in MODES:
        t = totals[mode]
        lines.append(f"| **series** | {sum(nbytes)} | {sum(raw):.2f} | {mode} | {t['blocked']:.2f} | {t['durable']:.2f} "
                     f"| {t['link']} | {ratio(t['durable'], totals[DIRECT]['durable'])} "
                     f"| {ratio(t['durable'], sum(raw))} |")
    lines += [
        "",
        "Modes: " + "; ".join(f"**{m}**: {LABELS[m]}" for m in MODES) + ".",
        "",
        f"Read back: the last checkpoint (ckpt.{a.checkpoints - 1}) of every mode was loaded from the durable store "
        f"(Cascade: `dcp.load` with `cascade.torch.Reader` in a fresh node store, reading through its agent; the "
        f"baseline: `FsspecReader`) and matched the trained state bit for bit (SHA-256 of every tensor's bytes): "
        + "; ".join(f"{m} {v['load_s']:.2f} s, {v['load_link_rx']} B over the link" for m, v in verify.items())
        + f". The durable store held, per mode, for the {a.checkpoints} checkpoints: "
        + "; ".join(f"{m} {v['stored']} B" for m, v in verify.items()) + ".",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    open(a.out, "w").write(text)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"suite": "dcp-durable", "machine": machine(), "torch": torch.__version__, "link": link,
                   "link_bytes_per_s": per_s, "width": a.width, "steps": a.steps, "command": command,
                   "started": started, "elapsed_s": elapsed, "load_average": load0, "bytes": nbytes,
                   "raw_s": raw, "modes": {m: {"label": LABELS[m], "rows": rows[m], **verify[m]} for m in MODES}},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
