"""A real store of each test's own, made and destroyed with the `cascade` command (no mocks).

The `cascade` binary: $CASCADE_BIN, else $CARGO_TARGET_DIR/debug/cascade, else target/debug
of the repository, else `cascade` on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def cascade_bin() -> str:
    candidates = [os.environ.get("CASCADE_BIN")]
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        candidates.append(os.path.join(target, "debug", "cascade"))
    candidates.append(str(REPO / "target" / "debug" / "cascade"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    found = shutil.which("cascade")
    if found:
        return found
    pytest.fail("no cascade binary: build it (cargo build -p cascade-cli) or set CASCADE_BIN")


class StoreEnv:
    """A store named /cascade-py-<random>, an empty config file, a durable directory, and the
    process environment pointing at them (CASCADE_STORE, CASCADE_CONFIG, CASCADE_DURABLE)."""

    def __init__(
        self,
        tmp: Path,
        capacity: str = "64MiB",
        durable: Optional[Path] = None,
        more_env: Optional[Dict[str, str]] = None,
    ) -> None:
        """`durable`: a durable directory shared with other stores (the simulated nodes of a
        job); `more_env`: more settings for every command and agent (CASCADE_NODE...)."""
        self.name = f"/cascade-py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.config = tmp / "config.toml"
        self.config.write_text("")
        self.durable = durable or tmp / "durable"
        self.durable.mkdir(exist_ok=True)
        self.bin = cascade_bin()
        self.agents: List[subprocess.Popen] = []
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "AWS_")) and k != "LD_PRELOAD"
        }
        self.env.update(
            CASCADE_STORE=self.name,
            CASCADE_CONFIG=str(self.config),
            CASCADE_DURABLE=str(self.durable),
        )
        self.env.update(more_env or {})
        self.cascade("init", "--capacity", capacity, "--spill-size", "0", "--prefault", "off", "--max-files", "1024")

    def cascade(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [self.bin, *args], env=self.env, capture_output=True, text=True, timeout=120, cwd=self.tmp
        )
        if check and out.returncode != 0:
            raise AssertionError(f"cascade {args} failed: {out.stderr}")
        return out

    def start_agent(self) -> subprocess.Popen:
        """`cascade agent` draining to the durable directory, once it is ready."""
        p = subprocess.Popen(
            [self.bin, "agent", "-v"], env=self.env, stderr=subprocess.PIPE, text=True, cwd=self.tmp
        )
        self.agents.append(p)
        assert p.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            # After the log line's timestamp and level (docs/operations.md).
            if "cascade agent: store " in line:
                return p
        raise AssertionError(f"agent did not start (exit {p.poll()})")

    def close(self) -> None:
        for p in self.agents:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.cascade("destroy", "--force", check=False)


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreEnv]:
    env = StoreEnv(tmp_path)
    for k in list(os.environ):
        if k.startswith("CASCADE_"):
            monkeypatch.delenv(k)
    for k in ("CASCADE_STORE", "CASCADE_CONFIG", "CASCADE_DURABLE"):
        monkeypatch.setenv(k, env.env[k])
    import cascade

    # The module functions attach the configured store once per process.
    monkeypatch.setattr(cascade, "_default", None)
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def store(store_env: StoreEnv):
    import cascade

    return cascade.Store()
