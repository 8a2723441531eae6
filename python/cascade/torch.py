"""PyTorch distributed checkpoints (``torch.distributed.checkpoint``) in the Cascade store.

``Writer(path)`` is a ``StorageWriter`` and ``Reader(path)`` a ``StorageReader``: give them to
``dcp.save`` / ``dcp.async_save`` / ``dcp.load`` (torch 2.x) or to ``save_state_dict`` /
``load_state_dict`` (torch 1.13, where the module is ``torch.distributed._shard.checkpoint``).
Each rank writes its items straight into the node store, one file per rank
(``__<rank>_0.distcp``); the coordinator writes ``.metadata`` last and commits the
directory as a checkpoint, so the agent drains it down the levels and a restart finds the
newest complete one. On a job of several nodes, each node's part is committed by the last of
its ranks to finish (docs/python.md, "Several nodes"); a reader on any node reads what its
store lacks through from the levels below. The layout is torch's own ``FileSystemWriter``
layout, so the same directory read through ``cascade run`` or a ``cascade mount`` is a plain
DCP checkpoint.

This module needs PyTorch; ``import cascade`` alone does not.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import socket
from typing import Any, Dict, List, Optional, Tuple, Union

try:
    import torch
    from torch.futures import Future
except ImportError as e:  # pragma: no cover - exercised in the venv without torch
    raise ImportError(
        f"cascade.torch needs PyTorch ({e}); install torch, or use cascade without it"
    ) from e

try:  # torch >= 2.0
    import torch.distributed.checkpoint as _dcp
    from torch.distributed.checkpoint import filesystem as _fs
except ImportError:  # torch 1.13
    import torch.distributed._shard.checkpoint as _dcp  # type: ignore[no-redef]
    from torch.distributed._shard.checkpoint import filesystem as _fs  # type: ignore[no-redef]

Metadata = _dcp.Metadata
SavePlan = _dcp.SavePlan
LoadPlan = _dcp.LoadPlan
SavePlanner = _dcp.SavePlanner
LoadPlanner = _dcp.LoadPlanner
WriteResult = _dcp.storage.WriteResult
_WriteItemType = _dcp.planner.WriteItemType
_LoadItemType = _dcp.planner.LoadItemType
# torch's own record of where an item lies: keeping it makes `.metadata` readable by
# torch's FileSystemReader too.
_StorageInfo = _fs._StorageInfo

_METADATA = ".metadata"
_SUFFIX = ".distcp"


def _store(store: Any) -> Any:
    if store is not None:
        return store
    import cascade

    # The process's configured store, attached once: an attach maps the whole store, and
    # its pages are faulted in again by the first writes through each new mapping (a new
    # Store per checkpoint doubled dcp.save's time).
    return cascade._store()


def _save_without_crc32() -> Any:
    """`torch.save(tensor, stream)` without the zip records' CRC32, or None where this torch
    cannot (before 2.6; then torch.save). Computing the CRC32 is a third of dcp.save's time
    into the store, and nothing checks it: torch.load reads a damaged record without a word
    (tried on torch 2.15), while Cascade checks every file's BLAKE3 on its way down the
    levels and back (docs/durable-layout.md). torch's own switch for it is process-wide
    (`set_crc32_options`), which would change the application's saves too, also during an
    async_save; so the writer is built as torch.save builds it, with the CRC32 off."""
    serialization = torch.serialization
    if not (
        hasattr(serialization, "get_crc32_options")
        and hasattr(serialization, "_get_storage_alignment")
        and hasattr(serialization, "_save")
    ):
        return None

    def save(tensor: "torch.Tensor", stream: Any) -> None:
        writer = torch._C.PyTorchFileWriter(stream, False, serialization._get_storage_alignment())
        serialization._save(tensor, writer, pickle, serialization.DEFAULT_PROTOCOL, False)
        writer.write_end_of_file()

    return save


def _storage_bytes(tensor: "torch.Tensor") -> int:
    """Bytes of the storage under `tensor` (torch 2.x untyped storage, or 1.13's)."""
    if hasattr(tensor, "untyped_storage"):
        return int(tensor.untyped_storage().nbytes())
    return int(tensor.storage().size()) * tensor.element_size()


def _narrow(tensor: "torch.Tensor", offsets: Any, lengths: Any) -> "torch.Tensor":
    """The part of a saved tensor a read asks for (a shard of it)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if offset != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


@dataclasses.dataclass
class _RankNode:
    """What each rank's local plan tells the coordinator: the node it writes on."""

    node: str


@dataclasses.dataclass
class _RankPrefix:
    """What `prepare_global_plan` hands each rank: its files' name prefix, its index in the
    plan, and, on a node other than the coordinator's, the indexes of every rank writing on
    that node (the last of them to finish commits the node's part)."""

    prefix: str
    index: int = 0
    node_ranks: Tuple[int, ...] = ()


class _CheckpointPath:
    """What torch 2.x asks of a writer or reader about its checkpoint's place: any store
    path is a valid checkpoint id, and `reset` moves to another (a writer reused for the next
    checkpoint)."""

    path: str

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return True


try:  # torch >= 2.4: async_save stages through the writer when it is an AsyncStager
    from torch.distributed.checkpoint.staging import BlockingAsyncStager as _Stager
except ImportError:  # pragma: no cover - older torch has no async_save
    _Stager = object  # type: ignore[assignment,misc]


class Writer(_CheckpointPath, _dcp.StorageWriter, _Stager):  # type: ignore[misc,valid-type]
    """Writes a distributed checkpoint into the Cascade store under `path` (a store path,
    with or without the store's mount prefix) and commits it when the save finishes.

    `commit=False` leaves committing to the caller (e.g. a job-wide commit). Tensors are
    saved as torch.save saves them, without the zip CRC32 that torch.load never checks
    (`zip_crc32=True` computes it, for tools that unzip the records)."""

    def __init__(
        self,
        path: Union[str, os.PathLike],
        store: Any = None,
        commit: bool = True,
        zip_crc32: bool = False,
    ) -> None:
        _dcp.StorageWriter.__init__(self)
        if _Stager is not object:
            # async_save copies the state dict to CPU memory as for torch's FileSystemWriter
            # (its default stager, for writers that are not stagers, is slower: 0.49 s
            # against 0.28 s for 1 GiB here).
            _Stager.__init__(self)
        self.path = os.fspath(path)
        self.store = _store(store)
        self.commit = commit
        self.is_coordinator = False
        self._save = (None if zip_crc32 else _save_without_crc32()) or torch.save

    # torch 2.x names; 1.13 calls `init`.
    def set_up_storage_writer(self, is_coordinator: bool) -> None:
        self.is_coordinator = is_coordinator

    def init(self, is_coordinator: bool) -> None:
        self.set_up_storage_writer(is_coordinator)

    def _node(self) -> str:
        return self.store.node or socket.gethostname()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return dataclasses.replace(plan, storage_data=_RankNode(self._node()))

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        nodes = [getattr(plan.storage_data, "node", None) for plan in plans]
        here = self._node()
        on_node: Dict[Optional[str], List[int]] = {}
        for i, node in enumerate(nodes):
            on_node.setdefault(node, []).append(i)
        # The coordinator's node is committed in `finish`, after `.metadata`; every other
        # node by the last of its ranks to finish writing.
        return [
            dataclasses.replace(
                plan,
                storage_data=_RankPrefix(
                    f"__{i}_",
                    i,
                    () if nodes[i] == here or not self.commit else tuple(on_node[nodes[i]]),
                ),
            )
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        prefix: _RankPrefix = plan.storage_data
        name = f"{prefix.prefix}0{_SUFFIX}"
        results = []
        # Each node has a store of its own: the directory is made where this rank writes.
        self.store.makedirs(self.path, exist_ok=True)
        # Bytes first, then tensors, as torch's writer does.
        items = sorted(plan.items, key=lambda i: i.type != _WriteItemType.BYTE_IO)
        with self.store.open(_join(self.path, name), "wb") as stream:
            for item in items:
                data = planner.resolve_data(item)
                offset = stream.tell()
                if item.type == _WriteItemType.BYTE_IO:
                    stream.write(data.getbuffer())
                else:
                    tensor = data.detach().cpu()
                    # A view saves its whole storage; save only what it shows.
                    if _storage_bytes(tensor) != tensor.numel() * tensor.element_size():
                        tensor = tensor.clone()
                    self._save(tensor, stream)
                length = stream.tell() - offset
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_StorageInfo(name, offset, length),
                    )
                )
        if prefix.node_ranks:
            self._node_part_done(prefix.index, prefix.node_ranks)
        future: Future = Future()
        future.set_result(results)
        return future

    def _node_part_done(self, index: int, node_ranks: Tuple[int, ...]) -> None:
        """Commits this node's part of the checkpoint once every rank writing on this node
        has closed its file: each leaves a mark in a directory beside the checkpoint; the
        rank that sees all marks and wins the exclusive claim commits (and clears up). A
        commit needs every file of the node closed (EBUSY otherwise), so no rank commits
        before the others are done, and no collective call is needed (async_save runs this
        in a thread of its own)."""
        head, _, tail = self.path.rstrip("/").rpartition("/")
        sync = _join(head or "/", f".{tail}.cascade-dcp")
        self.store.makedirs(sync, exist_ok=True)
        marks = {f"done.{r}" for r in node_ranks}
        self.store.open(_join(sync, f"done.{index}"), "wb").close()

        def all_marked() -> bool:
            # This node's store only (no read-through): the marks never leave it.
            return marks <= set(self.store.listdir(sync, read_through=False))

        claim = _join(sync, "claim")
        try:
            if not all_marked():
                return  # a rank of this node is still writing: the last one commits
            self.store.open(claim, "xb").close()
        except (FileExistsError, FileNotFoundError):
            return  # another rank of this node commits, or has committed and cleared up
        try:
            # The claim may come after a winner released it: its marks are gone then.
            if all_marked():
                for mark in marks:
                    self.store.remove(_join(sync, mark))
                self.store.commit(self.path)
        finally:
            self.store.remove(claim)
            try:
                self.store.rmdir(sync)
            except OSError:
                pass  # a late rank's claim: it removes the directory

    def finish(self, metadata: Metadata, results: List[List[Any]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        temporary = _join(self.path, _METADATA + ".tmp")
        with self.store.open(temporary, "wb") as f:
            pickle.dump(metadata, f)
        # The metadata appears whole or not at all: a reader never sees half of it.
        self.store.rename(temporary, _join(self.path, _METADATA))
        if self.commit:
            self.store.commit(self.path)

    def storage_meta(self) -> Any:
        return None


class Reader(_CheckpointPath, _dcp.StorageReader):
    """Reads a distributed checkpoint from the Cascade store under `path`; files the node
    store no longer holds are fetched from the levels below (read-through)."""

    def __init__(self, path: Union[str, os.PathLike], store: Any = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.store = _store(store)
        self.storage_data: Dict[Any, Any] = {}

    def read_metadata(self) -> Metadata:
        with self.store.open(_join(self.path, _METADATA), "rb") as f:
            return pickle.load(f)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool) -> None:
        self.storage_data = metadata.storage_data

    def init(self, metadata: Metadata, is_coordinator: bool) -> None:
        self.set_up_storage_reader(metadata, is_coordinator)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        by_file: Dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in by_file.items():
            with self.store.open(_join(self.path, name), "rb") as f:
                for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                    info = self.storage_data[item.storage_index]
                    f.seek(info.offset)
                    piece = io.BytesIO(f.read(info.length))
                    if item.type == _LoadItemType.BYTE_IO:
                        planner.load_bytes(item, piece)
                        continue
                    tensor = torch.load(piece, map_location="cpu")
                    tensor = _narrow(tensor, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != tensor.size():
                        raise ValueError(
                            f"{name}: item {item.storage_index} has size {tuple(tensor.size())}, "
                            f"the state dict expects {tuple(target.size())}"
                        )
                    target.copy_(tensor)
                    planner.commit_tensor(item, target)
        future: Future = Future()
        future.set_result(None)
        return future


__all__ = ["Writer", "Reader"]
