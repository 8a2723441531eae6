"""Files of the store from Python: bytes, numpy, pickle, torch; listdir, stat, remove."""

from __future__ import annotations

import io
import os
import pickle

import pytest

import cascade


def test_bytes_round_trip(store: cascade.Store) -> None:
    data = os.urandom(3 * (1 << 20) + 12345)  # crosses chunk boundaries
    store.makedirs("/run1/ckpt.1")
    with store.open("/run1/ckpt.1/blob", "wb") as f:
        assert isinstance(f, io.BufferedIOBase) and f.writable() and not f.readable()
        f.write(data[:100])
        f.write(memoryview(data)[100:])
    with store.open("/cascade/run1/ckpt.1/blob", "rb") as f:
        assert f.readable() and not f.writable() and f.mode == "rb"
        assert f.read() == data
    with store.open("/run1/ckpt.1/blob", "rb", buffering=0) as raw:
        buf = bytearray(1000)
        raw.seek(len(data) - 500)
        assert raw.readinto(buf) == 500
        assert bytes(buf[:500]) == data[-500:]
        assert raw.readinto(buf) == 0
        assert raw.tell() == len(data)


def test_modes(store: cascade.Store) -> None:
    with store.open("/f", "wb") as f:
        f.write(b"hello")
    with store.open("/f", "ab") as f:
        f.write(b" world")
    with store.open("/f", "r+b") as f:
        f.seek(0)
        f.write(b"J")
        f.seek(0, io.SEEK_END)
        assert f.tell() == 11
        f.truncate(5)
    with store.open("/f", "rb") as f:
        assert f.read() == b"Jello"
    with pytest.raises(FileExistsError):
        store.open("/f", "xb")
    with store.open("/g", "xb") as f:
        f.write(b"x")
    with pytest.raises(ValueError):
        store.open("/f", "r")
    with pytest.raises(FileNotFoundError):
        store.open("/missing", "rb")
    with pytest.raises(IsADirectoryError):
        store.open("/", "rb")


def test_listdir_stat_remove(store: cascade.Store) -> None:
    store.makedirs("/cascade/a/b")
    with store.open("/a/b/x", "wb") as f:
        f.write(b"12345")
    with store.open("/a/y", "wb") as f:
        f.write(b"")
    assert store.listdir("/a") == ["b", "y"]
    assert store.listdir("/cascade/a/b") == ["x"]
    st = store.stat("/a/b/x")
    assert (st.size, st.is_dir) == (5, False)
    assert st.mtime > 0
    assert store.stat("/a").is_dir
    store.remove("/a/b/x")
    assert store.listdir("/a/b") == []
    with pytest.raises(FileNotFoundError) as e:
        store.stat("/a/b/x")
    assert e.value.errno == 2
    assert isinstance(e.value, cascade.StoreError)
    assert str(e.value) == "/a/b/x: No such file or directory"
    with pytest.raises(FileExistsError):
        store.makedirs("/a", exist_ok=False)


def test_pickle(store: cascade.Store) -> None:
    obj = {"step": 42, "losses": [0.5, 0.25], "name": "run1", "blob": os.urandom(100_000)}
    with store.open("/obj.pkl", "wb") as f:
        pickle.dump(obj, f)
    with store.open("/obj.pkl", "rb") as f:
        assert pickle.load(f) == obj


def test_numpy_save_load(store: cascade.Store) -> None:
    np = pytest.importorskip("numpy")
    a = np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32)
    with store.open("/a.npy", "wb") as f:
        np.save(f, a)
    with store.open("/a.npy", "rb") as f:
        b = np.load(f)
    assert b.dtype == a.dtype and np.array_equal(a, b)
    # readinto straight into an array's memory
    out = np.empty_like(a)
    with store.open("/a.npy", "rb", buffering=0) as raw:
        raw.seek(store.stat("/a.npy").size - a.nbytes)
        assert raw.readinto(out) == a.nbytes
    assert np.array_equal(a, out)


def test_torch_save_load_state_dict(store: cascade.Store) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 1}
    store.makedirs("/run1/ckpt.1")
    with store.open("/cascade/run1/ckpt.1/model.pt", "wb") as f:
        torch.save(state, f)
    with store.open("/run1/ckpt.1/model.pt", "rb") as f:
        back = torch.load(f)
    assert back["step"] == 1
    for k, v in state["model"].items():
        assert torch.equal(v, back["model"][k]), k
    assert torch.equal(
        state["opt"]["state"][0]["exp_avg"], back["opt"]["state"][0]["exp_avg"]
    )
