"""torch.distributed helpers: the torchrun environment, rank checks, gather with gradient.

We use torchrun + torch.distributed only; nothing here spawns processes itself.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_from_env(device: torch.device | None = None) -> bool:
    """Initialise the default process group when started by torchrun. Returns True if distributed."""
    if dist.is_available() and dist.is_initialized():
        return True
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) < 2:
        return False
    backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    if backend == "nccl":  # NCCL collectives run on the current device: bind it to this rank's GPU
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    return True


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


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
