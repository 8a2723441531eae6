#!/usr/bin/env python3
"""Plots for bench/results/node-store.json (the chunk-size sweep and the spill-over curve),
bench/results/interposition.json (calls per second and bandwidth by write size),
bench/results/staging.json (staging throughput by writer processes and servers),
bench/results/fuse.json (FUSE vs LD_PRELOAD, tmpfs, disk and memcpy by operation, and by
writer processes), bench/results/dedup.json (stored bytes and ingest speed of the dedup
repository against restic, borg, cp and zstd by series), bench/results/dcp-durable.json
(per checkpoint, the time until durable by mode), bench/results/durable.json (the stall and
the time until durable of a checkpoint written straight to S3 and through Cascade) and
bench/results/dedup-link.json (time until durable and bytes on the link per series, plain,
dedup, deltas, staging servers).

usage: python3 bench/plot.py [RESULTS_JSON] [OUT_DIR]
Writes chunk-sweep.png and spill-over.png, interposition-sweep.png, staging-throughput.png,
fuse.png, dedup.png, dcp-durable.png, durable.png or dedup-link.png, next to the JSON (or
into OUT_DIR).
"""

import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size_label(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def ok(row):
    s = row["gbps"]
    return all(isinstance(s.get(k), (int, float)) for k in ("median", "min", "max"))


def errbars(stats):
    med = [s["median"] for s in stats]
    lo = [s["median"] - s["min"] for s in stats]
    hi = [s["max"] - s["median"] for s in stats]
    return med, [lo, hi]


def plot_sweep(rep, out):
    rows = rep["results"]["sweep"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    procs = sorted({r["procs"] for r in rows})
    for i, p in enumerate(procs):
        rs = sorted((r for r in rows if r["procs"] == p and ok(r)),
                    key=lambda r: r["chunk_size"])
        xs = [r["chunk_size"] for r in rs]
        med, err = errbars([r["gbps"] for r in rs])
        color = f"C{i}"
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=color,
                    label=f"Cascade, {p} process{'es' if p > 1 else ''}")
        base = [t["memcpy_shm_gbps"]["median"] for t in rep["results"].get("tight_pairs", [])
                if t["kind"] == "write" and t["procs"] == p]
        if not base:
            base = [w["gbps"]["median"] for w in rep["results"]["writes"]
                    if w["method"] == "memcpy-shm" and w["procs"] == p]
        if base and isinstance(base[0], (int, float)):
            ax.axhline(base[0], color=color, linestyle="--", linewidth=1,
                       label=f"memcpy (1 MiB) into pre-faulted shm, {p} proc")
    xs = sorted({r["chunk_size"] for r in rows})
    ticks_x(ax, xs, [size_label(x) for x in xs], rotation=45, ha="right")
    ax.set_xlabel("chunk size (writes of 1 MiB, or of the chunk size when larger)")
    ax.set_ylabel("aggregate write bandwidth (GB/s)")
    size = rep["options"]["size"]
    ax.set_title(f"Chunk-size sweep, {size_label(size)} per process (median, min-max)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out, "chunk-sweep.png")


def save(fig, out, name, rect=None):
    """Lays out `fig`, writes it as OUT/NAME and returns the path."""
    fig.tight_layout(**({"rect": rect} if rect else {}))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_y(ax):
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def ticks_x(ax, xs, labels=None, base=2, **kw):
    """A log2 x axis (base=None: linear) with a tick and its label at each of xs."""
    if base:
        ax.set_xscale("log", base=base)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels if labels is not None else [str(x) for x in xs], **kw)


def bars(ax, groups, methods, get, value):
    """Grouped bars: for each (method, label) of methods, one bar per group where
    get(group, method) gives a row; value(row) is (height, (below, above)) or a height."""
    width, errs = 0.8 / max(len(methods), 1), False
    for i, (m, label) in enumerate(methods):
        xs, med, lo, hi = [], [], [], []
        for j, g in enumerate(groups):
            r = get(g, m)
            if r:
                v = value(r)
                errs = isinstance(v, tuple)
                v, (d, u) = v if errs else (v, (0, 0))
                xs.append(j - 0.4 + width * (i + 0.5))
                med.append(v)
                lo.append(d)
                hi.append(u)
        hatch = "//" if label.startswith(("fuse", "restic", "borg", "zstd", "cp")) else None
        ax.bar(xs, med, width, yerr=[lo, hi] if errs else None, capsize=2,
               color=f"C{i}", label=label, hatch=hatch,
               edgecolor="black" if hatch else None, linewidth=0.5)
    ax.set_xticks(range(len(groups)))


def spread(g):
    return g["median"], (g["median"] - g["min"], g["max"] - g["median"])


def min_y(rows):
    return min(r["gbps"]["min"] for r in rows if ok(r))


def max_y(rows):
    return max(r["gbps"]["max"] for r in rows if ok(r))


def plot_spill(rep, out):
    rows = rep["results"]["spill"]
    if not rows:
        return None
    models = {m["procs"]: m for m in rep["results"]["spill_model"]}
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, p in enumerate(sorted({r["procs"] for r in rows})):
        rs = sorted((r for r in rows if r["procs"] == p and ok(r)),
                    key=lambda r: r["spilled_bytes"])
        xs = [100.0 * r["spilled_bytes"] / r["total_bytes"] for r in rs]
        med, err = errbars([r["gbps"] for r in rs])
        color = f"C{i}"
        ax.errorbar(xs, med, yerr=err, marker="o", linestyle="none", capsize=3, color=color,
                    label=f"measured, {p} process{'es' if p > 1 else ''}")
        m = models.get(p)
        if m:
            tm, ts = m["t_mem_gbps"], m["t_ssd_gbps"]
            curve_x = [x / 10.0 for x in range(0, 1001)]
            curve_y = [1.0 / ((1 - f / 100.0) / tm + (f / 100.0) / ts) for f in curve_x]
            ax.plot(curve_x, curve_y, color=color, linewidth=1,
                    label=f"size/(mem/T_mem + ssd/T_ssd), T_mem={tm:.1f}, T_ssd={ts:.2f} GB/s")
    ax.set_xscale("symlog", linthresh=3.0)
    ticks = [0, 3.125, 6.25, 12.5, 25, 50, 100]
    ticks_x(ax, ticks, [f"{t:g}" for t in ticks], base=None)
    ax.set_xlabel("share of the data spilled to the SSD file (%)")
    ax.set_ylabel("write bandwidth incl. File::sync (GB/s)")
    log_y(ax)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([t for t in (0.5, 1, 2, 3, 5, 10, 20, 30, 50)
                   if min_y(rows) * 0.8 <= t <= max_y(rows) * 1.25])
    size = rep["options"]["spill_size"]
    ax.set_title(f"Spill-over, {size_label(size)} per process (paper 000, Table 3)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out, "spill-over.png")


def plot_interposition(rep, out):
    rows = [r for r in rep["results"]["sweep"]
            if all(isinstance(r[k].get("median"), (int, float)) for k in ("gbps", "ns_per_call"))]
    if not rows:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.4))
    labels = {"preload": "C program + libcascade.so (preload)",
              "store-api": "store API (File::write_at)",
              "tmpfs": "C program, tmpfs (no library)"}
    procs = sorted({r["procs"] for r in rows})
    styles = {p: ls for p, ls in zip(procs, ["-", "--", ":", "-."])}
    for i, m in enumerate(("preload", "store-api", "tmpfs")):
        for p in procs:
            rs = sorted((r for r in rows if r["method"] == m and r["procs"] == p),
                        key=lambda r: r["io"])
            if not rs:
                continue
            xs = [r["io"] for r in rs]
            lab = f"{labels[m]}, {p} proc"
            med, err = errbars([r["ns_per_call"] for r in rs])
            ax1.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=f"C{i}",
                         linestyle=styles[p], label=lab)
            med, err = errbars([r["gbps"] for r in rs])
            ax2.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=f"C{i}",
                         linestyle=styles[p], label=lab)
    xs = sorted({r["io"] for r in rows})
    for ax in (ax1, ax2):
        ticks_x(ax, xs, [size_label(x) for x in xs], rotation=45, ha="right")
        ax.set_xlabel("bytes per write() call")
        ax.grid(True, which="both", alpha=0.3)
    log_y(ax1)
    ax1.set_ylabel("ns per call (per process)")
    ax1.set_title("Time per write() call")
    ax2.set_ylabel("aggregate write bandwidth (GB/s)")
    ax2.set_ylim(bottom=0)
    ax2.set_title("Bandwidth")
    handles, labels_ = ax2.get_legend_handles_labels()
    fig.legend(handles, labels_, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle("Writes by size, one new file per size (median, min-max)")
    return save(fig, out, "interposition-sweep.png", (0, 0.1, 1, 1))


def plot_staging(rep, out):
    rows = [r for r in rep["results"].get("throughput", []) if ok(r)]
    if not rows:
        return None
    base = {b["name"]: b["gbps"]["median"] for b in rep["results"].get("baselines", [])}
    cores = rep.get("machine", {}).get("cores", "?")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    procs = sorted({r["procs"] for r in rows})
    for i, k in enumerate(sorted({r["servers"] for r in rows})):
        rs = sorted((r for r in rows if r["servers"] == k), key=lambda r: r["procs"])
        xs = [r["procs"] for r in rs]
        med, err = errbars([r["gbps"] for r in rs])
        lab = f"{k} server{'s' if k > 1 else ''}"
        ax1.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=f"C{i}", label=lab)
        ab = [r for r in rs if r.get("absorb_gbps")]
        if ab:
            med, err = errbars([r["absorb_gbps"] for r in ab])
            ax2.errorbar([r["procs"] for r in ab], med, yerr=err, marker="s", capsize=3,
                         color=f"C{i}", label=lab)
    for name, style in (("fio end_fsync", "--"), ("disk write+fsync", ":"),
                        ("tmpfs", "-.")):
        if isinstance(base.get(name), (int, float)):
            for ax in (ax1, ax2):
                ax.axhline(base[name], color="grey", linestyle=style, linewidth=1,
                           label=f"{name} (same run)")
    total = rows[0].get("total_bytes", 0)
    for ax in (ax1, ax2):
        ticks_x(ax, procs)
        ax.set_xlabel(f"writer processes ({size_label(total)} in all, one file each)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
    ax1.set_ylabel("aggregate GB/s")
    ax1.set_title("First write until every file is staged")
    ax2.set_title("Servers' absorb rate (appending to arenas)")
    handles, labels_ = ax1.get_legend_handles_labels()
    fig.legend(handles, labels_, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(f"Staging throughput, servers on loopback, {cores} cores in all "
                 "(median, min-max)")
    return save(fig, out, "staging-throughput.png", (0, 0.12, 1, 1))


FUSE_PARTS = [("writes", "1 MiB\nwrites"), ("small-writes", "small\nwrites"),
              ("reads", "1 MiB\nreads"), ("small-reads", "small\nreads"), ("cp", "cp")]
FUSE_TARGETS = ["memcpy", "tmpfs", "tmpfs-rewrite", "fuse", "fuse-kcache", "preload", "disk",
                "disk+fsync", "disk-cold"]


def plot_fuse(rep, out):
    rows = [r for r in rep["results"].get("rows", []) if ok(r)]
    if not rows:
        return None
    small = rep.get("options", {}).get("small", 4096)
    parts = [(k, lab.replace("small", size_label(small))) for k, lab in FUSE_PARTS
             if any(r["part"] == k for r in rows)]
    targets = [t for t in FUSE_TARGETS
               if any(r["method"] == t and r["part"] != "scaling" for r in rows)]
    scaling = [r for r in rows if r["part"] == "scaling"]
    fig, axes = plt.subplots(1, 2 if scaling else 1, figsize=(14 if scaling else 10, 5.8),
                             gridspec_kw={"width_ratios": [2.2, 1]} if scaling else None)
    ax1 = axes[0] if scaling else axes
    one = {(r["part"], r["method"]): r for r in rows if r["procs"] == 1}
    bars(ax1, [k for k, _ in parts], [(t, t) for t in targets],
         lambda k, t: one.get((k, t)), lambda r: spread(r["gbps"]))
    ax1.set_xticklabels([lab for _, lab in parts])
    log_y(ax1)
    ax1.set_ylabel("GB/s (one process)")
    ax1.grid(True, axis="y", which="both", alpha=0.3)
    ax1.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    ax1.set_title(f"{size_label(rep['options']['size'])} file, one process")
    if scaling:
        ax2 = axes[1]
        for i, t in enumerate(targets):
            rs = sorted((r for r in scaling if r["method"] == t), key=lambda r: r["procs"])
            if not rs:
                continue
            med, err = errbars([r["gbps"] for r in rs])
            ax2.errorbar([r["procs"] for r in rs], med, yerr=err, marker="o", capsize=3,
                         color=f"C{i}", label=t)
        procs = sorted({r["procs"] for r in scaling})
        ticks_x(ax2, procs)
        log_y(ax2)
        ax2.set_xlabel(f"writer processes ({size_label(rep['options']['size'])} in all)")
        ax2.set_ylabel("aggregate GB/s, 1 MiB writes")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=8)
        cores = rep.get("machine", {}).get("cores", "?")
        ax2.set_title(f"Writer processes ({cores} cores, {rep['options']['threads']} "
                      "mount threads)")
    fig.suptitle("FUSE (cascade mount) vs LD_PRELOAD, tmpfs, disk, memcpy (median, min-max)")
    return save(fig, out, "fuse.png")


def plot_dedup(rep, out):
    rows = [r for r in rep["results"].get("rows", []) if ok(r)]
    if not rows:
        return None
    series = [x["name"] for x in rep["results"].get("series", [])]
    configs = [c["label"] for c in rep["options"]["configs"]]
    store0 = rep["options"]["stores"][0]

    def get(s, method, store):
        for r in rows:
            if r["series"] == s and r["method"] == method and r["store"] == store:
                return r
        return None

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6.6))
    # Reduction: ours (each configuration, first store), restic, borg, zstd -1.
    red = [(c, store0, f"ours {c}") for c in configs]
    red += [("restic", "disk", "restic"), ("borg", "disk", "borg"),
            ("zstd -1", "disk", "zstd -1 (no dedup)")]
    red = [m for m in red if any(get(s, m[0], m[1]) for s in series)]
    bars(ax1, series, [((m, st), label) for m, st, label in red],
         lambda s, m: get(s, *m), lambda r: r["reduction"])
    goals = {"lammps": 1.7, "torch": 3.0}
    for j, s in enumerate(series):
        if s in goals:
            ax1.plot([j - 0.45, j + 0.45], [goals[s]] * 2, "k--", linewidth=1)
            ax1.annotate(f"goal {goals[s]}x", (j + 0.45, goals[s]), fontsize=8,
                         ha="right", va="bottom")
    ax1.set_xticklabels(series)
    ax1.set_ylabel("reduction (input / stored)")
    ax1.grid(True, axis="y", alpha=0.3)
    ax1.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax1.set_title("Stored bytes: reduction by series (higher is better)")
    # Ingest GB/s (log): ours default on each store, the other configurations on the first
    # store, restic and borg raw, cp, zstd.
    spd = [(configs[0], st, f"ours {configs[0]} ({st})") for st in rep["options"]["stores"]]
    spd += [(c, store0, f"ours {c} ({store0})") for c in configs[1:]]
    spd += [("restic", "disk", "restic"), ("borg", "disk", "borg"), ("cp -r", "disk", "cp -r (disk)"),
            ("zstd -1", "disk", "zstd -1")]
    spd = [m for m in spd if any(get(s, m[0], m[1]) for s in series)]
    bars(ax2, series, [((m, st), label) for m, st, label in spd],
         lambda s, m: get(s, *m), lambda r: spread(r["gbps"]))
    ax2.axhline(1.0, color="k", linestyle="--", linewidth=1)
    ax2.annotate("goal 1 GB/s", (len(series) - 0.5, 1.0), fontsize=8, ha="right", va="bottom")
    ax2.set_xticklabels(series)
    log_y(ax2)
    ax2.set_ylabel("ingest GB/s (all snapshots, in order)")
    ax2.grid(True, axis="y", which="both", alpha=0.3)
    ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    cores = rep.get("machine", {}).get("cores", "?")
    ax2.set_title(f"Ingest speed ({cores} cores; median, min-max)")
    fig.suptitle("Dedup repository (cascade-dedup) vs restic, borg, cp and zstd on real "
                 "checkpoint series")
    return save(fig, out, "dedup.png")


def plot_dcp_durable(rep, out):
    """Per checkpoint, the time until it was durable for each mode, and the raw minimum."""
    modes = rep["modes"]
    n = len(rep["bytes"])
    fig, ax = plt.subplots(figsize=(8, 4.8))
    width = 0.8 / len(modes)
    for i, (mode, m) in enumerate(modes.items()):
        xs = [k + (i - (len(modes) - 1) / 2) * width for k in range(n)]
        ax.bar(xs, [r["durable"] for r in m["rows"]], width, color=f"C{i}", label=mode)
    ax.hlines(rep["raw_s"], [k - 0.45 for k in range(n)], [k + 0.45 for k in range(n)],
              colors="black", linestyles="dashed", label="raw minimum (bytes at the link rate)")
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"ckpt.{k}" for k in range(n)])
    ax.set_ylabel("seconds from the start of dcp.save until durable")
    ax.set_title(f"DCP checkpoints of {rep['bytes'][0] / 1e9:.2f} GB durable over a "
                 f"{rep['link_bytes_per_s'] * 8 / 1e9:g} Gbit/s link")
    top = max(r["durable"] for m in modes.values() for r in m["rows"])
    ax.set_ylim(0, top * 1.3)
    ax.legend(fontsize="small", loc="upper left", ncol=3)
    return save(fig, out, "dcp-durable.png")


def plot_durable(rep, out):
    """Per checkpoint size: the application's stall writing straight to S3 or a directory and
    under Cascade (log scale), and Cascade's time until durable against the link minimum."""
    sizes = rep["results"]["sizes"]
    if not sizes:
        return None
    labels = [size_label(s["bytes"]) for s in sizes]
    via = {"cli": "cascade commit", "lib": "cascade_commit()"}
    commits = [c["commit_via"] for c in sizes[0]["cascade"]]

    def cascade(s, how, key):
        for c in s["cascade"]:
            if c["commit_via"] == how:
                return c[key]
        return None

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.4))
    stalls = [("direct-s3", lambda s: s["direct_s3_s"], "straight to S3 (put, then on with work)"),
              ("direct-dir", lambda s: s["direct_dir_s"], "straight to a local directory + fsync")]
    stalls += [(f"cascade-{h}", (lambda s, h=h: cascade(s, h, "stall_s")),
                f"Cascade, committed with {via.get(h, h)}") for h in commits]
    bars(ax1, labels, [((get,), label) for _, get, label in stalls],
         lambda g, m: m[0](sizes[labels.index(g)]), spread)
    ax1.set_xticklabels(labels)
    log_y(ax1)
    ax1.set_ylabel("application stall per checkpoint, s (log)")
    ax1.grid(True, axis="y", which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="upper left")
    ax1.set_title("How long the application waits (lower is better)")
    durable = [("direct-s3", lambda s: s["direct_s3_s"], "straight to S3: durable when the put returns")]
    durable += [(f"cascade-{h}", (lambda s, h=h: cascade(s, h, "until_durable_s")),
                 f"Cascade ({via.get(h, h)}): until the marker is in S3") for h in commits]
    bars(ax2, labels, [((get,), label) for _, get, label in durable],
         lambda g, m: m[0](sizes[labels.index(g)]), spread)
    for j, s in enumerate(sizes):
        ax2.hlines(s["link_min_nominal_s"], j - 0.45, j + 0.45, colors="black",
                   linestyles="dashed", label="link minimum (bytes at the nominal rate)" if j == 0 else None)
        ax2.hlines(1.2 * s["link_min_nominal_s"], j - 0.45, j + 0.45, colors="red",
                   linestyles="dotted", label="target: 1.2x the link minimum" if j == 0 else None)
    ax2.set_xticklabels(labels)
    ax2.set_ylabel("seconds from the start of the write until durable")
    ax2.grid(True, axis="y", alpha=0.3)
    ax2.legend(fontsize=8, loc="upper left")
    link = rep["results"].get("link", {})
    ax2.set_title(f"Time until durable over {link.get('name', 'the link')} "
                  f"({link.get('nominal_bytes_per_s', 0) * 8 / 1e9:g} Gbit/s)")
    fig.suptitle("A checkpoint to a throttled S3 store: written straight there, or through "
                 "Cascade (median, min-max)")
    return save(fig, out, "durable.png")


def plot_dedup_link(rep, out):
    """Per series: the time until every snapshot is durable over the link, plain, with dedup,
    with deltas and through two staging servers (when staged, lighter), and the bytes sent."""
    series = rep["series"]
    if not series:
        return None
    names = [s["series"] for s in series]
    modes = [("plain", "plain layout"), ("dedup", "dedup"), ("delta", "dedup + deltas (default)"),
             ("staged_dedup", "2 staging servers, dedup"),
             ("staged_delta", "2 staging servers, dedup + deltas")]
    modes = [(m, label) for m, label in modes if all(s.get(m) for s in series)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.6))
    width = 0.8 / len(modes)
    for i, (m, label) in enumerate(modes):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(series))]
        ax1.bar(xs, [s[m]["seconds"] for s in series], width, color=f"C{i}", label=label)
        staged = [s[m].get("staged") for s in series]
        if any(v is not None for v in staged):
            ax1.bar(xs, [v or 0 for v in staged], width * 0.5, color="white", alpha=0.6,
                    edgecolor="black", linewidth=0.5, hatch="..",
                    label="staged (safe from a node loss)" if i == len(modes) - 1 else None)
        ax2.bar(xs, [s[m]["wire"] / 1e6 for s in series], width, color=f"C{i}", label=label)
    for j, s in enumerate(series):
        ax1.hlines(s["link_min_s"], j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                   label="raw bytes at the link rate" if j == 0 else None)
        ax2.hlines(s["bytes"] / 1e6, j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                   label="raw bytes of the series" if j == 0 else None)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(series)))
        ax.set_xticklabels([f"{n} ({s['snapshots']} snapshots)" for n, s in zip(names, series)])
        ax.grid(True, axis="y", alpha=0.3)
    ax1.set_ylabel("seconds until every snapshot is durable (sum)")
    ax1.set_title("Time until durable (lower is better)")
    ax1.legend(fontsize=7, loc="upper right")
    ax2.set_ylabel("MB sent over the link")
    ax2.set_title("Bytes on the link")
    ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Real checkpoint series to S3 over a {rep['link_bytes_per_s'] * 8 / 1e9:g} Gbit/s "
                 f"link, with and without dedup (median of {rep.get('reps', '?')} per snapshot)")
    return save(fig, out, "dedup-link.png")


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "bench/results/node-store.json"
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(src))
    with open(src) as f:
        rep = json.load(f)
    os.makedirs(out, exist_ok=True)
    suite = rep.get("suite")
    plots = {"interposition": (plot_interposition,), "staging": (plot_staging,),
             "fuse": (plot_fuse,), "dedup": (plot_dedup,),
             "dcp-durable": (plot_dcp_durable,), "durable": (plot_durable,),
             "dedup-link": (plot_dedup_link,)}.get(suite, (plot_sweep, plot_spill))
    plots = [plot(rep, out) for plot in plots]
    for path in plots:
        if path:
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
