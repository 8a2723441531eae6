"""Cascade for Python: files in the node store, commit and wait, without LD_PRELOAD.

>>> import cascade
>>> store = cascade.Store()                      # the configured store (CASCADE_STORE, config file)
>>> with store.open("/run1/ckpt.42/model.pt", "wb") as f:
...     torch.save(model.state_dict(), f)
>>> cascade.commit("/run1/ckpt.42")
>>> cascade.wait("/run1/ckpt.42", level="durable", timeout=600)

Paths are store paths (``/run1/ckpt.42``) or the same under the store's mount prefix
(``/cascade/run1/ckpt.42``, what programs under ``cascade run`` see). See docs/python.md.
"""

from __future__ import annotations

import io
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from . import _native
from ._errors import (
    NoStoreError,
    OutsideStoreError,
    StoreError,
    StoreFileExistsError,
    StoreFileNotFoundError,
    StoreFullError,
    StoreIsADirectoryError,
    StoreNotADirectoryError,
    StorePermissionError,
    StoreTimeoutError,
    _make,
)

_native._set_error_factory(_make)

__all__ = [
    "Store",
    "StoreFile",
    "StatResult",
    "LevelEntry",
    "Committed",
    "Waited",
    "commit",
    "wait",
    "levels",
    "status",
    "StoreError",
    "NoStoreError",
    "StoreFullError",
    "OutsideStoreError",
    "StoreFileNotFoundError",
    "StoreFileExistsError",
    "StoreIsADirectoryError",
    "StoreNotADirectoryError",
    "StorePermissionError",
    "StoreTimeoutError",
]

PathLike = Union[str, "os.PathLike[str]"]

# Reads and writes go through the extension once per buffer: a larger buffer than io's 8 KiB
# keeps that per-call cost small for checkpoint-sized files.
DEFAULT_BUFFER_SIZE = 1 << 20


@dataclass(frozen=True)
class StatResult:
    """What :meth:`Store.stat` returns."""

    size: int
    """Bytes (0 for a directory)."""
    mtime: float
    """Modification time, seconds since the epoch."""
    mtime_ns: int
    is_dir: bool
    mode: int
    """Permission bits."""
    chunks_in_memory: int
    chunks_spilled: int
    remote: bool
    """Only in a level below (evicted, or listed from the durable store); fetched when read."""


@dataclass(frozen=True)
class LevelEntry:
    """One line of ``cascade ls --levels``."""

    path: str
    is_dir: bool
    level: str
    """Where a file's bytes are: memory, spill, memory+spill, durable; "-" for a directory;
    "durable" or "parts" for a checkpoint only the durable store has."""
    size: Optional[int]
    state: str
    """"checkpoint #3 complete", "dirty", "durable", "writing", ... ("" for a plain directory)."""


@dataclass(frozen=True)
class Committed:
    """What :func:`commit` did."""

    path: str
    seq: int
    """The checkpoint's sequence number."""
    flushed: bool
    """It goes to the durable store (every Nth checkpoint does: checkpoint.flush_every)."""
    agent_running: bool
    """An agent drains it now (else when one starts)."""


@dataclass(frozen=True)
class Waited:
    """What :func:`wait` found."""

    path: str
    level: str
    """The level reached: memory, staged or durable (at least the one waited for)."""
    files: int
    seconds: float
    only_durable: bool
    """Gone from the node store, complete in the durable store."""


def _path(path: PathLike) -> str:
    p = os.fspath(path)
    if not isinstance(p, str):
        raise TypeError(f"store paths are str, not {type(p).__name__}")
    return p


def _bytes_view(b: Any) -> memoryview:
    """`b` (any buffer: bytes, bytearray, numpy array, tensor storage) as flat bytes, no copy."""
    m = memoryview(b)
    return m if m.format == "B" and m.ndim == 1 else m.cast("B")


class StoreFile(io.RawIOBase):
    """An unbuffered binary file of the store (what ``Store.open(..., buffering=0)`` returns;
    otherwise it comes wrapped in io's buffering).

    ``readinto`` copies from the store straight into the caller's buffer."""

    def __init__(self, native: Any, name: str, mode: str) -> None:
        super().__init__()
        self._f = native
        self.name = name
        self.mode = mode
        self._readable = "r" in mode or "+" in mode
        self._writable = any(c in mode for c in "wax+")
        # Set while a BufferedRandom is built over this file (see _Buffered).
        self._claim_both = False

    def readable(self) -> bool:
        return self._readable or self._claim_both

    def writable(self) -> bool:
        return self._writable or self._claim_both

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:  # type: ignore[override]
        self._checkClosed()
        return int(self._f.readinto(_bytes_view(b)))

    def readall(self) -> bytes:
        self._checkClosed()
        size = self._f.size() - self._f.tell()
        buf = bytearray(max(size, 0))
        n = self.readinto(buf) if size > 0 else 0
        del buf[n:]
        rest = super().readall()  # grew meanwhile: read on until EOF
        return bytes(buf) + (rest or b"")

    def write(self, b: Any) -> int:  # type: ignore[override]
        self._checkClosed()
        return int(self._f.write(_bytes_view(b)))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        self._checkClosed()
        return int(self._f.tell())

    def truncate(self, size: Optional[int] = None) -> int:
        self._checkClosed()
        if size is None:
            size = self.tell()
        return int(self._f.truncate(size))

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a file of the Cascade store has no file descriptor")

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()
            finally:
                self._f.close()

    def __repr__(self) -> str:
        return f"<cascade.StoreFile name={self.name!r} mode={self.mode!r}>"


class _Buffered(io.BufferedRandom):
    """The buffered file :meth:`Store.open` returns: io's C BufferedRandom (Python's own
    buffering, readinto and write straight through for large requests), reporting the
    mode's readable()/writable().

    Not a BufferedReader/BufferedWriter on purpose: numpy before 1.25 takes any of those
    for a file with a descriptor and calls fileno() (np.save, np.load fail); BufferedRandom
    is left to the generic file-object path. Reading a write-only file fails with EBADF
    from the store instead of io.UnsupportedOperation (both are OSError)."""

    def readable(self) -> bool:
        return bool(self.raw.readable())

    def writable(self) -> bool:
        return bool(self.raw.writable())

    @property
    def mode(self) -> str:
        return str(self.raw.mode)


_MODES = {
    # mode: read, write, create, create_new, truncate, append
    "rb": (True, False, False, False, False, False),
    "r+b": (True, True, False, False, False, False),
    "wb": (False, True, True, False, True, False),
    "w+b": (True, True, True, False, True, False),
    "ab": (False, True, True, False, False, True),
    "a+b": (True, True, True, False, False, True),
    "xb": (False, True, True, True, False, False),
    "x+b": (True, True, True, True, False, False),
}


def _normal_mode(mode: str) -> str:
    if "t" in mode or "b" not in mode:
        raise ValueError(f"invalid mode {mode!r}: the store opens binary files only (rb, wb, ab, xb, r+b)")
    key = mode.replace("b", "")
    plus = "+" in key
    key = key.replace("+", "")
    if len(key) != 1 or len(set(mode)) != len(mode):
        raise ValueError(f"invalid mode {mode!r}")
    return key + ("+b" if plus else "b")


class Store:
    """A Cascade node store, attached.

    ``name`` is the store's shared-memory name; None resolves it as the ``cascade`` command
    does (``CASCADE_STORE``, the config file, then ``/cascade-<uid>``). Raises
    :class:`NoStoreError` when there is none."""

    def __init__(self, name: Optional[str] = None) -> None:
        self._s = _native.NativeStore(name)

    @property
    def name(self) -> str:
        """The store's shared-memory name ("/cascade-1000")."""
        return str(self._s.name)

    @property
    def mount_prefix(self) -> str:
        """The prefix under which programs see the store ("/cascade")."""
        return str(self._s.mount_prefix)

    @property
    def node(self) -> Optional[str]:
        """This node's name in a multi-node job (``SLURMD_NODENAME``, ``CASCADE_NODE``, the
        host name...: docs/cluster.md); None outside a job."""
        node = self._s.node
        return None if node is None else str(node)

    def resolve(self, path: PathLike) -> str:
        """The store path ``path`` names: mount prefix stripped, ``.`` and ``..`` resolved."""
        return str(self._s.resolve(_path(path)))

    def open(self, path: PathLike, mode: str = "rb", buffering: int = -1) -> Any:
        """Opens a file of the store like the built-in ``open`` in a binary mode (rb, wb,
        ab, xb, r+b, w+b, a+b, x+b): io's buffered file (a BufferedRandom reporting the
        mode's readable()/writable(), see :class:`_Buffered`) over a :class:`StoreFile`, or the
        StoreFile itself with ``buffering=0``. Files are created 0600. The file counts as
        being written until closed (a checkpoint with an open writer cannot be committed).
        A file the node store lacks (evicted, or written on another node) is read through
        from the levels below by the node agent, as under ``cascade run``."""
        p = _path(path)
        m = _normal_mode(mode)
        native = self._s.open(p, *_MODES[m])
        raw = StoreFile(native, p, m)
        if buffering == 0:
            return raw
        size = DEFAULT_BUFFER_SIZE if buffering < 0 or buffering == 1 else buffering
        raw._claim_both = True
        try:
            return _Buffered(raw, size)
        finally:
            raw._claim_both = False

    def listdir(self, path: PathLike = "/", read_through: bool = True) -> List[str]:
        """Names in a directory, sorted: with `read_through`, also the names the levels below
        hold (asked of the node agent); else only what this node's store has."""
        return list(self._s.listdir(_path(path), read_through))

    def stat(self, path: PathLike) -> StatResult:
        """Size, mtime, kind and where the data is."""
        size, mtime_ns, is_dir, mode, mem, spill, remote = self._s.stat(_path(path))
        return StatResult(size, mtime_ns / 1e9, mtime_ns, is_dir, mode, mem, spill, remote)

    def exists(self, path: PathLike) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: PathLike) -> bool:
        try:
            return self.stat(path).is_dir
        except FileNotFoundError:
            return False

    def remove(self, path: PathLike) -> None:
        """Removes a file (its chunks are freed at once)."""
        self._s.unlink(_path(path))

    def rmdir(self, path: PathLike) -> None:
        """Removes an empty directory."""
        self._s.rmdir(_path(path))

    def mkdir(self, path: PathLike) -> None:
        self._s.mkdir(_path(path))

    def makedirs(self, path: PathLike, exist_ok: bool = True) -> None:
        """Creates a directory and its parents (``exist_ok=False``: FileExistsError if it is
        there already)."""
        p = _path(path)
        if not exist_ok and self.exists(p):
            raise StoreFileExistsError(17, f"{p}: File exists")
        self._s.makedirs(p)

    def rename(self, src: PathLike, dst: PathLike) -> None:
        """Atomic rename; replaces a file or an empty directory."""
        self._s.rename(_path(src), _path(dst))

    def commit(self, path: PathLike) -> Committed:
        """Marks ``path`` (a file or directory) as a complete checkpoint, as ``cascade
        commit`` does; the agent then drains it."""
        p = _path(path)
        seq, flushed, agent = self._s.commit(p)
        return Committed(p, seq, flushed, agent)

    def wait(self, path: PathLike, level: str = "durable", timeout: Optional[float] = None) -> Waited:
        """Blocks until ``path`` is at ``level`` (memory, staged, durable), as ``cascade
        wait`` does. Raises at once when it cannot get there (no agent, a torn file, an open
        writer) and :class:`StoreTimeoutError` after ``timeout`` seconds."""
        p = _path(path)
        if level not in ("memory", "staged", "durable"):
            raise ValueError(f"unknown level {level!r} (use memory, staged or durable)")
        lvl, files, seconds, only_durable = self._s.wait(p, level, timeout)
        return Waited(p, lvl, files, seconds, only_durable)

    def levels(self, path: PathLike = "/") -> List[LevelEntry]:
        """Every entry below ``path`` with its level and state (``cascade ls --levels``)."""
        return [LevelEntry(*e) for e in self._s.levels(_path(path))]

    def status(self) -> Dict[str, Any]:
        """``cascade status --json`` as a dict (the agent's counters under "agent", None
        when no agent answers)."""
        return dict(json.loads(self._s.status_json()))

    def __repr__(self) -> str:
        return f"<cascade.Store {self.name}>"


_default: Optional[Store] = None
_default_lock = threading.Lock()


def _store() -> Store:
    # The configured store, attached once per process.
    global _default
    with _default_lock:
        if _default is None:
            _default = Store()
        return _default


def commit(path: PathLike) -> Committed:
    """:meth:`Store.commit` on the configured store."""
    return _store().commit(path)


def wait(path: PathLike, level: str = "durable", timeout: Optional[float] = None) -> Waited:
    """:meth:`Store.wait` on the configured store."""
    return _store().wait(path, level, timeout)


def levels(path: PathLike = "/") -> List[LevelEntry]:
    """:meth:`Store.levels` on the configured store."""
    return _store().levels(path)


def status() -> Dict[str, Any]:
    """:meth:`Store.status` on the configured store."""
    return _store().status()
