"""The compute backend, decided once: CUDA when available, else the CPU with Triton's interpreter.

Import this module before anything imports `triton`: on a machine without CUDA it sets
TRITON_INTERPRET=1, which Triton reads when it is first imported. `kernels/__init__.py`
imports it first, so any `import kernels...` is safe. The rest of the lab asks this module which
device its tensors belong on.
"""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache

import torch

# Decided at import time, before triton can be imported by anyone else.
_CUDA = torch.cuda.is_available() and os.environ.get("PAGED_LAB_FORCE_CPU") != "1"
# PAGED_LAB_AOT=1: a process that only compiles the kernels for a GPU it may not have
# (bench/aot.py); the interpreter would replace @triton.jit with a Python function.
_AOT = os.environ.get("PAGED_LAB_AOT") == "1"
if not _CUDA and not _AOT:
    os.environ["TRITON_INTERPRET"] = "1"


@dataclass(frozen=True)
class ComputeBackend:
    device: torch.device
    name: str  # e.g. "NVIDIA H200" or "CPU"
    triton_mode: str  # "Triton compiled" or "Triton interpreter"

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def label(self) -> str:
        """What the sidebar shows, e.g. "CPU, Triton interpreter"."""
        return f"{self.name}, {self.triton_mode}"


@cache
def backend() -> ComputeBackend:
    if _CUDA:
        name = torch.cuda.get_device_name(0)
        return ComputeBackend(torch.device("cuda"), name, "Triton compiled")
    return ComputeBackend(torch.device("cpu"), "CPU", "Triton interpreter")


def device() -> torch.device:
    return backend().device


_INTERPRETER_LOCK = threading.Lock()


def kernel_launch() -> threading.Lock | nullcontext:
    """Hold this around a kernel launch. Triton's interpreter patches `triton.language` for the
    whole process while a kernel runs, so two threads (two browser sessions on one server, or a
    page's background prefetch) must not run interpreted kernels at once: they take turns.
    Compiled launches need no lock."""
    return nullcontext() if _CUDA else _INTERPRETER_LOCK
