"""Cascade's exceptions: OSError subclasses carrying errno and the one-line reason."""

from __future__ import annotations

import errno as _errno
from typing import Dict, Type


class StoreError(OSError):
    """A store operation failed. ``errno`` is set; ``strerror`` and ``str()`` give the reason
    in one line (``/run1/ckpt.1: No such file or directory``)."""

    def __str__(self) -> str:
        return str(self.strerror)


class NoStoreError(StoreError, FileNotFoundError):
    """There is no store to attach (errno ENOENT): create one with ``cascade init`` or run
    the job under ``cascade run``."""


class StoreFullError(StoreError):
    """The store is full: memory and spill chunks, or its file table (errno ENOSPC)."""


class OutsideStoreError(StoreError, ValueError):
    """The path is not a path in the store: relative, or ``..`` above its root (EINVAL)."""


class StoreFileNotFoundError(StoreError, FileNotFoundError):
    """ENOENT."""


class StoreFileExistsError(StoreError, FileExistsError):
    """EEXIST."""


class StoreIsADirectoryError(StoreError, IsADirectoryError):
    """EISDIR."""


class StoreNotADirectoryError(StoreError, NotADirectoryError):
    """ENOTDIR."""


class StorePermissionError(StoreError, PermissionError):
    """EACCES, EPERM."""


class StoreTimeoutError(StoreError, TimeoutError):
    """ETIMEDOUT: :func:`cascade.wait` gave up."""


_BY_ERRNO: Dict[int, Type[StoreError]] = {
    _errno.ENOENT: StoreFileNotFoundError,
    _errno.EEXIST: StoreFileExistsError,
    _errno.EISDIR: StoreIsADirectoryError,
    _errno.ENOTDIR: StoreNotADirectoryError,
    _errno.EACCES: StorePermissionError,
    _errno.EPERM: StorePermissionError,
    _errno.ETIMEDOUT: StoreTimeoutError,
    _errno.ENOSPC: StoreFullError,
}


def _make(kind: str, errno: int, message: str) -> StoreError:
    """Called by the extension for every failure."""
    if kind == "nostore":
        cls: Type[StoreError] = NoStoreError
    elif kind == "outside":
        cls = OutsideStoreError
    else:
        cls = _BY_ERRNO.get(errno, StoreError)
    return cls(errno, message)
