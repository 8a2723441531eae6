"""The `cascade://` fsspec protocol (cascade.fsspec) against a real store."""

from __future__ import annotations

import os

import fsspec

import cascade


def test_cascade_urls_round_trip(store: cascade.Store) -> None:
    data = os.urandom(300_000)
    # Registered by the package's fsspec.specs entry point, no import needed.
    with fsspec.open("cascade:///run1/ckpt.1/model.bin", "wb") as f:
        f.write(data)
    assert store.open("/run1/ckpt.1/model.bin", "rb").read() == data
    with fsspec.open("cascade:///cascade/run1/ckpt.1/model.bin", "rb") as f:
        assert f.read() == data
    fs = fsspec.filesystem("cascade")
    assert fs.ls("cascade:///run1", detail=False) == ["/run1/ckpt.1"]
    info = fs.info("cascade://run1/ckpt.1/model.bin")
    assert (info["type"], info["size"]) == ("file", len(data))
    assert fs.isdir("/run1/ckpt.1")
    fs.mv("/run1/ckpt.1/model.bin", "/run1/ckpt.1/renamed.bin")
    fs.cp_file("/run1/ckpt.1/renamed.bin", "/run1/copy.bin")
    assert store.open("/run1/copy.bin", "rb").read() == data
    fs.rm("/run1", recursive=True)
    assert not store.exists("/run1")


def test_missing_path_is_file_not_found(store: cascade.Store) -> None:
    fs = fsspec.filesystem("cascade")
    try:
        fs.info("cascade:///nope")
    except FileNotFoundError as e:
        assert "nope" in str(e)
    else:
        raise AssertionError("info of a missing path succeeded")
