"""The errors a user hits, each as one clear exception."""

from __future__ import annotations

import errno
import os
import uuid

import pytest

import cascade


def test_no_store(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    name = f"/cascade-py-none-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "config.toml"
    config.write_text("")
    monkeypatch.setenv("CASCADE_CONFIG", str(config))
    monkeypatch.setenv("CASCADE_STORE", name)
    with pytest.raises(cascade.NoStoreError) as e:
        cascade.Store()
    assert e.value.errno == errno.ENOENT
    assert isinstance(e.value, FileNotFoundError)
    assert str(e.value) == f"no Cascade store {name}: run `cascade init` or start the job under `cascade run`"
    with pytest.raises(cascade.NoStoreError):
        cascade.Store(name)


def test_full_store(store: cascade.Store) -> None:
    # The store holds 64 MiB and spills nowhere.
    block = os.urandom(1 << 20)
    with pytest.raises(cascade.StoreFullError) as e:
        with store.open("/big", "wb") as f:
            for _ in range(100):
                f.write(block)
    assert e.value.errno == errno.ENOSPC
    assert "No space left on device" in str(e.value)
    store.remove("/big")
    with store.open("/small", "wb") as f:
        f.write(block)


def test_path_outside_store(store: cascade.Store) -> None:
    for bad in ("relative/ckpt", "/cascade/../../etc/passwd", "/.."):
        with pytest.raises(cascade.OutsideStoreError) as e:
            store.open(bad, "wb")
        assert e.value.errno == errno.EINVAL
        assert "not a path in the store" in str(e.value)
        assert isinstance(e.value, ValueError)
    assert store.resolve("/cascade/run1/./a/../ckpt.1") == "/run1/ckpt.1"
    assert store.resolve("/cascadex/a") == "/cascadex/a"
