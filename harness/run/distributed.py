"""Sharding a sweep across processes (GPUs, nodes) started by ``torchrun`` or ``accelerate launch``.

Process management is torch.distributed's: the launcher sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init` calls ``torch.distributed.init_process_group`` from them
(backend ``nccl`` on CUDA, ``gloo`` on CPU) and each rank runs on ``cuda:LOCAL_RANK`` when GPUs exist.
Without those variables (a plain ``lctx run``) everything here is a no-op for one process of rank 0.

How a sharded sweep runs (:func:`lctx.harness.run.runner.run_sweep`):

1. every rank reads all record files of the run directory (``records.jsonl`` and any
   ``records.rank{r}.jsonl`` left by an interrupted sharded run) to skip finished samples, then waits at
   a barrier, so no rank writes before all have read and all see the same work list;
2. :func:`shard` splits the remaining work deterministically (same list, same split on every rank);
3. rank r appends its records to ``records.rank{r}.jsonl`` (fsync'ed per sample, as a single process
   does with ``records.jsonl``);
4. after a barrier rank 0 :func:`merge_records` into ``records.jsonl`` (one record per key), removes the
   rank files and writes the tables and plots once; a second barrier keeps the ranks together until the
   merge is done.

The default timeout of collectives (a barrier waits for the slowest rank's whole share) is 24 h;
``LCTX_DIST_TIMEOUT_S`` changes it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lctx.defaults import DEVICE
from lctx.errors import LctxError

from lctx.harness.run.rundir import atomic_write
from lctx.harness.run.tables import read_records, record_key

T = TypeVar("T")

RECORDS = "records.jsonl"
_RANK_FILE = re.compile(r"^records\.rank(\d+)\.jsonl$")
_coord_group = None  # the group barriers and object collectives use (gloo, also when the default is nccl)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` in [0, world_size), ``local_rank`` on its node (its GPU index)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that merges records, writes tables and plots and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (:func:`broadcast`): what :func:`lctx.harness.run.rundir.run_dir_lock`
        calls, so the run directory's lock needs no import of this module."""
        return broadcast(obj)


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    try:
        return int(v) if v.strip() else default
    except ValueError:
        raise LctxError(f"environment variable {name}={v!r} is not an integer; unset it or launch with "
                        "torchrun / accelerate launch, which set it") from None


def env_info() -> DistInfo:
    """Rank, world size and local rank from the launcher's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, as torchrun and accelerate launch set them); one process of rank 0 without them.

    Raises:
        LctxError: a variable is not an integer, or RANK is outside [0, WORLD_SIZE).
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise LctxError(f"RANK={rank} is not in [0, WORLD_SIZE={world}); launch with torchrun or accelerate "
                        "launch, or unset RANK and WORLD_SIZE for a single process")
    return DistInfo(rank=rank, world_size=world, local_rank=local)


def init(device: str = DEVICE) -> DistInfo:
    """Join the process group of a ``torchrun`` / ``accelerate launch`` job (idempotent; a no-op for one
    process). Backend ``nccl`` when the run is on CUDA (``device`` auto/cuda with a GPU present), else
    ``gloo``; with nccl a gloo group is made as well for the barriers and small object exchanges, so that
    waiting for a slow rank does not occupy a GPU stream. Destroyed at exit (:func:`destroy`).

    Raises:
        LctxError: bad launcher variables (see :func:`env_info`); more processes on a node than GPUs.
    """
    global _coord_group
    info = env_info()
    if not info.distributed:
        return info

    if dist.is_initialized():
        return info
    on_cuda = torch.cuda.is_available() and not str(device).startswith("cpu")
    if on_cuda:
        n = torch.cuda.device_count()
        if info.local_rank >= n:
            raise LctxError(f"local rank {info.local_rank} has no GPU: this node has {n}; start at most {n} "
                            f"processes per node (torchrun --nproc_per_node {n})")
        torch.cuda.set_device(info.local_rank)
    timeout = timedelta(seconds=_env_int("LCTX_DIST_TIMEOUT_S", 24 * 3600))
    dist.init_process_group(backend="nccl" if on_cuda else "gloo", timeout=timeout)
    _coord_group = dist.new_group(backend="gloo", timeout=timeout) if on_cuda else None
    atexit.register(destroy)
    return info


def current() -> DistInfo:
    """This process's place: from the initialised process group, else from the environment."""

    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()))
    return env_info()


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def destroy() -> None:
    """Leave the process group (``destroy_process_group``); safe to call twice or without one."""
    global _coord_group

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _coord_group = None


def rank_device(device: str, info: DistInfo | None = None) -> str:
    """The device this rank evaluates on: ``cuda:LOCAL_RANK`` for ``auto`` or ``cuda`` when GPUs exist and
    the job has several processes; otherwise ``device`` unchanged.

    Raises:
        LctxError: an explicit ``cuda:N`` in a multi-process job (every rank would share one GPU).
    """
    info = info or current()
    if not info.distributed:
        return device
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{info.local_rank}"
    if device.startswith("cuda:"):
        raise LctxError(f"--device {device} under torchrun would put all {info.world_size} ranks on one GPU; "
                        "use --device cuda or auto (rank r runs on cuda:LOCAL_RANK)")
    return device


def barrier() -> None:
    """Wait until every rank gets here (no-op for one process)."""
    if _active():
        dist.barrier(group=_coord_group)


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable object; returned unchanged for one process)."""
    if not _active():
        return obj

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_coord_group)
    return box[0]


def gather(obj: Any) -> list:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` for one process)."""
    if not _active():
        return [obj]

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_coord_group)
    return out


def shard(items: Sequence[T], info: DistInfo, cost: Callable[[T], float] = lambda _: 1.0) -> list[T]:
    """This rank's share of ``items``: a deterministic split balanced by ``cost`` (e.g. the length in
    tokens), in the items' own order.

    Greedy longest-processing-time-first (Graham 1969): items by decreasing cost (ties: earlier first) go
    each to the rank with the least total cost so far (ties: lowest rank). Every rank computes the same
    split from the same list, so the shares are disjoint and together cover ``items`` exactly.
    Input: a sequence of n items; output: the k <= n items of rank ``info.rank``.
    """
    if not info.distributed:
        return list(items)
    load = [0.0] * info.world_size
    owner = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-float(cost(items[i])), i)):
        r = min(range(info.world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += float(cost(items[i]))
    return [it for it, r in zip(items, owner) if r == info.rank]


def check_same_work(keys: Sequence[tuple], what: str = "work list") -> None:
    """Raise on every rank when the ranks built different work lists (different arguments or files).

    Raises:
        LctxError: the ranks disagree (names the ranks); with one process never.
    """
    h = hashlib.sha1(json.dumps([list(k) for k in keys]).encode()).hexdigest()
    hs = gather(h)
    if len(set(hs)) > 1:
        odd = [r for r, x in enumerate(hs) if x != hs[0]]
        raise LctxError(f"ranks {odd} built a different {what} from rank 0; give every rank the same "
                        "command line, models and data")


def rank_records_path(out_dir: Path, info: DistInfo) -> Path:
    """Where this rank appends records: ``records.jsonl`` for one process, else ``records.rank{r}.jsonl``."""
    return out_dir / (RECORDS if not info.distributed else f"records.rank{info.rank}.jsonl")


def rank_files(out_dir: Path) -> list[Path]:
    """The ``records.rank{r}.jsonl`` files in ``out_dir``, by rank."""
    found = [(int(m.group(1)), p) for p in out_dir.glob("records.rank*.jsonl") if (m := _RANK_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def read_all_records(out_dir: Path, report=None) -> list[dict]:
    """Records of ``records.jsonl`` then of every rank file (an interrupted sharded run), in that order
    (damaged lines skipped; ``report`` is told how many, see :func:`lctx.harness.run.rundir.read_records`)."""
    out = read_records(out_dir / RECORDS, report)
    for p in rank_files(out_dir):
        out.extend(read_records(p, report))
    return out


def _dedupe(records: list[dict]) -> list[dict]:
    """One record per key (:func:`lctx.harness.run.tables.record_key`) where the runner wrote them: an ok record
    beats an error (a finished sample is never rerun, an errored one is), of errors alone the last one read
    wins, and an exact copy of an ok record (a rank file read again after its merge) is dropped. Another ok
    record of a key that has one is not the runner's (an appended line): both are kept, in their order, for
    :func:`lctx.harness.run.tables.vet_records` to judge, so the merge never drops a record the run wrote in
    favour of one it did not."""
    best: dict[tuple, list[dict]] = {}
    for r in records:
        k = record_key(r)
        old = best.get(k)
        if old is None or old[0].get("status") != "ok":
            best.pop(k, None)  # re-insert so the order follows the winning record
            best[k] = [r]
        elif r.get("status") == "ok" and all(o != r for o in old):
            old.append(r)
    return [r for rs in best.values() for r in rs]


def merge_records(out_dir: Path) -> list[dict]:
    """Rank 0, after all ranks finished: fold the rank files into ``records.jsonl`` (one record per key,
    written to a temporary file, fsync'ed and renamed over it), then delete the rank files. Without rank
    files ``records.jsonl`` is left as it is. Returns the records of ``records.jsonl``.

    A kill between the rename and the deletion leaves rank files whose records are already merged; the
    next run reads them again and the dedupe makes that harmless.
    """
    parts = rank_files(out_dir)
    path = out_dir / RECORDS
    if not parts:
        return read_records(path)
    merged = _dedupe(read_all_records(out_dir))

    atomic_write(path, lambda tmp: tmp.write_text("".join(json.dumps(r) + "\n" for r in merged)))
    for p in parts:
        p.unlink(missing_ok=True)
    return merged
