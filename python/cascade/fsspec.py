"""An fsspec file system for ``cascade://`` URLs, so that code taking a checkpoint URL
(PyTorch Lightning's checkpoint directory, Hugging Face ``save_pretrained`` through
fsspec, pandas/pyarrow) writes into the node store unchanged::

    import fsspec
    with fsspec.open("cascade:///run1/ckpt.42/model.pt", "wb") as f:
        torch.save(model.state_dict(), f)

``cascade:///run1/x`` and ``cascade://run1/x`` both name the store path ``/run1/x``; a path
with the store's mount prefix (``/cascade/run1/x``) names the same file. The protocol is
registered through the ``fsspec.specs`` entry point when the package is installed. This
module needs fsspec; ``import cascade`` alone does not.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Union

try:
    from fsspec.spec import AbstractFileSystem
except ImportError as e:  # pragma: no cover - exercised in the venv without fsspec
    raise ImportError(f"cascade.fsspec needs fsspec ({e}): pip install fsspec") from e


class CascadeFileSystem(AbstractFileSystem):
    """The node store as an fsspec file system (protocol ``cascade``)."""

    protocol = ("cascade",)
    root_marker = "/"

    def __init__(self, store: Optional[str] = None, **kwargs: Any) -> None:
        """`store`: the store's name (default: the configured one, as `cascade.Store()`)."""
        super().__init__(**kwargs)
        self._store_name = store
        self._store: Any = None

    @property
    def store(self) -> Any:
        # Attached on first use: creating the file system object must not need a store.
        if self._store is None:
            import cascade

            self._store = cascade.Store(self._store_name)
        return self._store

    @classmethod
    def _strip_protocol(cls, path: Union[str, List[str]]) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("cascade://"):
            path = path[len("cascade://") :]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        path = self._strip_protocol(path)
        st = self.store.stat(path)
        return {
            "name": path,
            "size": 0 if st.is_dir else st.size,
            "type": "directory" if st.is_dir else "file",
            "mtime": st.mtime,
        }

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        path = self._strip_protocol(path)
        top = self.info(path)
        if top["type"] != "directory":
            entries = [top]
        else:
            base = "" if path == "/" else path
            entries = [self.info(f"{base}/{name}") for name in sorted(self.store.listdir(path))]
        return entries if detail else [e["name"] for e in entries]

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        if "w" in mode or "a" in mode or "x" in mode:
            parent = path.rsplit("/", 1)[0]
            if parent and not self.exists(parent):
                self.store.makedirs(parent, exist_ok=True)
        return self.store.open(path, mode)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if create_parents:
            self.store.makedirs(path, exist_ok=True)
        else:
            self.store.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.store.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rm_file(self, path: str) -> None:
        self._rm(path)

    def _rm(self, path: str) -> None:
        # fsspec's recursive rm hands directories here too, deepest first.
        path = self._strip_protocol(path)
        if self.store.isdir(path):
            self.store.rmdir(path)
        else:
            self.store.remove(path)

    def rmdir(self, path: str) -> None:
        self.store.rmdir(self._strip_protocol(path))

    def mv(self, path1: str, path2: str, recursive: bool = False, **kwargs: Any) -> None:
        self.store.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while True:
                piece = src.read(1 << 20)
                if not piece:
                    break
                dst.write(piece)

    def modified(self, path: str) -> datetime.datetime:
        mtime = self.info(path)["mtime"]
        return datetime.datetime.fromtimestamp(mtime, tz=datetime.timezone.utc)

    def created(self, path: str) -> datetime.datetime:
        return self.modified(path)


__all__ = ["CascadeFileSystem"]
