"""Which device and which weight dtype: the names the user gives (`--device`, `OPENBOOK_DEVICE`,
`OPENBOOK_DTYPE`) checked and resolved, before any weights load."""

from __future__ import annotations

import contextlib
import os
from typing import Literal, get_args

import torch

DEVICE_ENV = "OPENBOOK_DEVICE"  # the default device everywhere: auto (default), cpu, cuda, cuda:N or mps
# Unset, a GPU is used when one is visible, as a user of a self-hosted service expects; on a machine
# without one this is the CPU, as before.
DEFAULT_DEVICE = "auto"


def resolve_device(name: str) -> str:
    """A torch device name; ``auto`` is cuda when a GPU is visible, else cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: cpu, cuda, cuda:N, mps or auto") from None
    return name


def require_device(name: str) -> None:
    """ValueError, before any weights move, when torch on this machine cannot reach device `name`."""
    kind = torch.device(name).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA GPU on this machine; name cpu")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r}: torch sees no Apple GPU on this machine; name cpu")


def default_device() -> str:
    """`BackboneConfig.device`'s default: $OPENBOOK_DEVICE, else DEFAULT_DEVICE, resolved."""
    return resolve_device(os.environ.get(DEVICE_ENV) or DEFAULT_DEVICE)


DTYPE_ENV = "OPENBOOK_DTYPE"  # the default weight dtype everywhere: auto (default) or one of DTYPES
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """The weights' dtype; ``auto`` is bfloat16 on CUDA (half the memory traffic, fp32's range), else float32.

    float32 stays the CPU default: it is what every CPU result in docs/ was measured in, and on a CPU
    without bf16 instructions bf16 is slower (smollm2-135m, 64 texts on the project's shared 2-core
    x86 machine: 48 s in float32, 66 s in bfloat16).
    """
    if name == "auto":
        return torch.bfloat16 if torch.device(resolve_device(str(device))).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(get_args(DtypeName))}, got {name!r}")
    return DTYPES[name]


def default_dtype() -> DtypeName:
    name = os.environ.get(DTYPE_ENV) or "auto"
    if name not in get_args(DtypeName):
        raise ValueError(f"${DTYPE_ENV} must be one of {', '.join(get_args(DtypeName))}, got {name!r}")
    return name  # type: ignore[return-value]  # checked just above


# What arithmetic is done in (a training run's `TrainConfig.precision`, a reader's tuning's
# `ReaderConfig.precision`); the weights are float32 either way. "auto" (a reader's tuning only):
# bfloat16 where the device multiplies it natively, else float32 (`resolve_precision`).
Precision = Literal["float32", "bfloat16"]
PrecisionChoice = Literal["auto", "float32", "bfloat16"]


def native_bfloat16(device: str | torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices in hardware: a CUDA GPU that supports it, or an x86
    CPU with AMX or AVX512-BF16 (elsewhere autocast emulates it, slower than float32)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind == "cpu":
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    return False


def resolve_precision(name: PrecisionChoice, device: str | torch.device) -> Precision:
    """`name`, with "auto" read as bfloat16 where `device` multiplies it natively, else float32."""
    if name == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return name


def precision_context(precision: Precision, device: str | torch.device) -> contextlib.AbstractContextManager:
    """Autocast to bfloat16 on `device` for "bfloat16", nothing for "float32".

    Without its cache of casts: autocast keeps the bfloat16 copy of each float32 weight until the
    outermost autocast block ends, and this one spans a whole run, so every forward after the first
    optimiser step would read the weights as they were before it.
    """
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)
