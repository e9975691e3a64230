"""torch.distributed helpers: the torchrun environment, rank checks, gather with gradient.

We use torchrun + torch.distributed only; nothing here spawns processes itself.
"""

from __future__ import annotations

import atexit
import os
import warnings

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_from_env(device: torch.device | None = None) -> bool:
    """Initialise the default process group when started by torchrun. Returns True if distributed.

    NCCL on GPUs, gloo on CPUs — and gloo when this node runs more processes than it has GPUs
    (NCCL refuses two ranks on one GPU; gloo lets a single-GPU machine test a 2-process run,
    slowly).  The group is destroyed at exit (NCCL asks for it, to finish pending work)."""
    if dist.is_available() and dist.is_initialized():
        return True
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) < 2:
        return False
    backend = choose_backend(device)
    if device is not None and device.type == "cuda":  # collectives run on the current device
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    atexit.register(shutdown)
    return True


def choose_backend(device: torch.device | None) -> str:
    if device is None or device.type != "cuda":
        return "gloo"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()
    if local_world > gpus:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            warnings.warn(f"{local_world} processes share {gpus} GPU(s) on this node: NCCL cannot put two "
                          "ranks on one GPU, so the gloo backend is used (slow; for testing)", stacklevel=3)
        return "gloo"
    return "nccl"


def shutdown() -> None:
    """Destroy the default process group (registered at exit by ``init_from_env``)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def backend() -> str:
    return dist.get_backend() if is_distributed() else ""


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def env_is_main() -> bool:
    """Rank 0 as torchrun's environment says (``RANK``), usable before the process group
    exists; a plain process is rank 0."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank along dim 0, rank order.

    The local slice is the caller's own tensor (not a copy), so gradients flow back to it;
    the other ranks' slices are constants here — each rank computes the gradient of its own
    part, and DDP's all-reduce sums the parameter gradients (the open_clip scheme).
    """
    if not is_distributed():
        return tensor
    if tensor.is_cuda and dist.get_backend() == "gloo":  # gloo gathers host tensors only
        parts = [torch.empty_like(tensor, device="cpu") for _ in range(world_size())]
        dist.all_gather(parts, tensor.detach().cpu().contiguous())
        parts = [part.to(tensor.device) for part in parts]
    else:
        parts = [torch.empty_like(tensor) for _ in range(world_size())]
        dist.all_gather(parts, tensor.detach().contiguous())
    parts[rank()] = tensor
    return torch.cat(parts, dim=0)


def all_gather_object(obj):
    if not is_distributed():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def dealt(count: int) -> range:
    """This rank's share of ``count`` work items dealt round-robin (all of them in one process)."""
    return range(rank(), count, world_size())


def gather_dealt(mine: dict) -> dict:
    """Every rank's ``{item: result}`` of its ``dealt`` share, merged: every rank gets them all
    (one process: ``mine``). A collective under torchrun: every rank calls it."""
    merged = {}
    for theirs in all_gather_object(mine):
        merged.update(theirs)
    return merged
