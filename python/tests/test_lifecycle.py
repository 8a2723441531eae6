"""commit, wait, levels and status against a real `cascade agent` draining to a directory."""

from __future__ import annotations

import os

import pytest

import cascade


def _write_ckpt(store: cascade.Store, path: str, n: int = 3) -> dict:
    store.makedirs(path)
    files = {}
    for i in range(n):
        data = os.urandom(200_000 + i)
        with store.open(f"{path}/rank{i}.dat", "wb") as f:
            f.write(data)
        files[f"rank{i}.dat"] = data
    return files


def test_commit_wait_durable(store_env, store: cascade.Store) -> None:
    store_env.start_agent()
    files = _write_ckpt(store, "/run1/ckpt.1")
    c = cascade.commit("/cascade/run1/ckpt.1")
    assert c.seq >= 1 and c.flushed and c.agent_running
    w = cascade.wait("/run1/ckpt.1", level="durable", timeout=60)
    assert w.level == "durable" and w.files == 3
    for name, data in files.items():
        assert (store_env.durable / "run1" / "ckpt.1" / name).read_bytes() == data
    lv = {e.path: e for e in cascade.levels("/run1")}
    assert lv["/run1/ckpt.1"].state.endswith("complete"), lv
    assert lv["/run1/ckpt.1/rank0.dat"].level == "memory"
    assert lv["/run1/ckpt.1/rank0.dat"].size == 200_000
    st = cascade.status()
    assert st["name"] == store_env.name
    assert st["agent"] is not None and st["agent"]["markers"] >= 1


def test_wait_without_agent_says_why(store_env, store: cascade.Store) -> None:
    _write_ckpt(store, "/run1/ckpt.2", 1)
    cascade.commit("/run1/ckpt.2")
    with pytest.raises(cascade.StoreError, match="no agent is running"):
        cascade.wait("/run1/ckpt.2", timeout=5)
    assert cascade.wait("/run1/ckpt.2", level="memory").level == "memory"


def test_commit_with_open_writer_fails(store_env, store: cascade.Store) -> None:
    store.makedirs("/run1/ckpt.3")
    f = store.open("/run1/ckpt.3/x", "wb")
    try:
        with pytest.raises(cascade.StoreError) as e:
            cascade.commit("/run1/ckpt.3")
        assert e.value.errno is not None
    finally:
        f.close()
    cascade.commit("/run1/ckpt.3")


def test_wait_missing_is_file_not_found(store_env, store: cascade.Store) -> None:
    with pytest.raises(FileNotFoundError):
        cascade.wait("/nothing", timeout=1)
    with pytest.raises(ValueError):
        cascade.wait("/nothing", level="tape")
