"""Device (and dtype) arguments checked once, by edbatch, with a message naming the value.

Used by :class:`~edbatch.executor.torch_executor.TorchExecutor`, ``DynamicBatch(device=)``
and ``experiments.train_model``, so ``device="cuda:7"`` on a machine with one GPU (or none)
fails at construction, not deep inside a kernel with torch's generic error.
"""

from __future__ import annotations

import re

import torch

from edbatch.errors import DeviceError

__all__ = ["check_device", "check_dtype"]

_PATTERN = re.compile(r"(cpu|cuda)(?::(\d+))?")


def check_device(device: object) -> torch.device:
    """``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``) as a
    ``torch.device`` that exists here; anything else raises :class:`DeviceError`."""
    if isinstance(device, torch.device):
        text = str(device)
    elif isinstance(device, str):
        text = device.strip()
    else:
        raise DeviceError(f"device must be a string such as 'cpu', 'cuda' or 'cuda:0', got "
                          f"{device!r} of type {type(device).__name__}")
    m = _PATTERN.fullmatch(text)
    if m is None or (m.group(1) == "cpu" and m.group(2) not in (None, "0")):
        raise DeviceError(f"unknown device {device!r}; edbatch runs on 'cpu', 'cuda' or "
                          f"'cuda:N' (N a GPU index)")
    if m.group(1) == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceError(f"device {device!r} asks for a GPU but torch sees none here "
                          f"(torch {torch.__version__}, CUDA build: "
                          f"{torch.version.cuda or 'no'}); use device='cpu'")
    index = None if m.group(2) is None else int(m.group(2))
    if index is not None and index >= count:
        raise DeviceError(f"device {device!r}: this machine has {count} GPU(s), "
                          f"cuda:0..cuda:{count - 1}; pass one of those or 'cuda'")
    return torch.device("cuda", index)


def check_dtype(dtype: object) -> torch.dtype:
    """A floating-point ``torch.dtype`` (or its name, ``"float32"``); else DeviceError."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise DeviceError(f"dtype must be a floating-point torch dtype (torch.float32, "
                          f"torch.float64, torch.float16, torch.bfloat16), got {dtype!r}")
    return dtype
