"""What this machine is: CPU, memory, GPUs, driver. Cheap to call (no torch import needed)."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_mib: int
    driver: str
    pcie: str = ""  # link generation and width now, e.g. "gen5 x16"


@dataclass(frozen=True)
class MachineInfo:
    host: str
    os: str
    cpu_model: str
    logical_cpus: int
    usable_cpus: int
    memory_bytes: int
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict:
        return asdict(self)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_bytes(field: str) -> int:
    """A field of /proc/meminfo in bytes; 0 where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _memory_bytes() -> int:
    return _meminfo_bytes("MemTotal")


def available_memory_bytes() -> int | None:
    """Memory the kernel could hand out now without swapping (MemAvailable); None if unknown."""
    return _meminfo_bytes("MemAvailable") or None


def _gpus_hidden() -> bool:
    """SUITE_HIDE_GPU=1 lets tests exercise the no-GPU paths anywhere. It is read on every call,
    never cached, so hiding the GPU in one test cannot hide it from the tests after it."""
    return os.environ.get("SUITE_HIDE_GPU") == "1"


def nvidia_gpus() -> tuple[GpuInfo, ...]:
    """GPUs as nvidia-smi reports them; empty when there is no NVIDIA driver."""
    return () if _gpus_hidden() else _nvidia_smi_gpus()


@functools.lru_cache(maxsize=1)
def _nvidia_smi_gpus() -> tuple[GpuInfo, ...]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [
                smi,
                "--query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        name, mem, driver, gen, width = (part.strip() for part in line.split(","))
        gpus.append(GpuInfo(name=name, memory_mib=int(float(mem)), driver=driver, pcie=f"gen{gen} x{width}"))
    return tuple(gpus)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), or all of them where that is unknown."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def require_gpu(tool: str, does: str, cupy_for: str | None = None) -> None:
    """Refuse, in one line, to run ``tool`` (which ``does`` something on a GPU) on a machine without
    a CUDA GPU, or, where it needs CuPy (``cupy_for``: what for), without CuPy."""
    import importlib.util

    from harness.errors import NeedsGpuError, UserError

    if not has_gpu():
        raise NeedsGpuError(f"{tool} needs a CUDA GPU: {does}, and torch sees none")
    if cupy_for is not None and importlib.util.find_spec("cupy") is None:
        raise UserError(
            f"{tool} needs CuPy {cupy_for} (pip install cupy-cuda12x or cupy-cuda13x, see envs/requirements-gpu.txt)"
        )


def has_gpu() -> bool:
    """A GPU that this Python can use: the driver sees one and torch was built for CUDA.

    The driver is asked first (cheap; no torch import on machines without NVIDIA GPUs), so the
    workflow and the measuring jobs agree: an NVIDIA box with the CPU build of torch has no GPU
    as far as the suite is concerned."""
    return not _gpus_hidden() and _torch_sees_a_gpu()


@functools.lru_cache(maxsize=1)
def _torch_sees_a_gpu() -> bool:
    if not _nvidia_smi_gpus():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def used_gpus() -> tuple[GpuInfo, ...]:
    """The GPUs this Python can use, as nvidia-smi describes them: none with the CPU build of torch
    or CUDA_VISIBLE_DEVICES empty (the host's GPUs ran nothing), the listed ones where it names
    them by index, else the first ``gpu_count()``. What a record and a label name: a CPU run on a
    GPU host measured no GPU."""
    if not has_gpu():
        return ()
    listed = _nvidia_smi_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices = [item.strip() for item in visible.split(",") if item.strip()]
        if indices and all(i.isdigit() and int(i) < len(listed) for i in indices):
            return tuple(listed[int(i)] for i in indices)
    return listed[: gpu_count()]


def gpu_count() -> int:
    """GPUs this Python can use (0 without a usable one): what decides which parts run here.
    Counted by torch, which honours CUDA_VISIBLE_DEVICES (nvidia-smi lists every GPU)."""
    if not has_gpu():
        return 0
    import torch

    return torch.cuda.device_count()


def hardware() -> tuple[tuple[str, ...], str]:
    """What kind of machine this is (:func:`kind`)."""
    return kind((g.name for g in used_gpus()), _cpu_model())


def kind(gpu_names, cpu_model) -> tuple[tuple[str, ...], str]:
    """A kind of machine: its GPU models (each once, sorted; a host's eight H200s are one kind) and
    its CPU model. For this machine (:func:`hardware`) or a provenance record's."""
    return tuple(sorted(set(gpu_names))), cpu_model


def shown(machine_kind: tuple[tuple[str, ...], str]) -> str:
    """A kind of machine (:func:`kind`) in words: its GPU models; its CPU model."""
    return f"{', '.join(machine_kind[0]) or 'no GPU'}; {machine_kind[1]}"


def other_hardware_in(folder: Path) -> list[str]:
    """The kinds of machine (in words) other than this one that the provenance records in
    ``folder``'s topic folders were measured on: a machine's folder holds one machine's results.
    A record that cannot be read or names no machine is no evidence (the readers refuse it)."""
    this, found = hardware(), set()
    for record in Path(folder).glob("*/*.provenance.json"):
        try:
            measured = json.loads(record.read_text()).get("machine")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(measured, dict) or not isinstance(measured.get("cpu_model"), str):
            continue
        gpus = measured.get("gpus")
        names = [g.get("name") for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
        measured_kind = kind((str(name) for name in names if name is not None), measured["cpu_model"])
        if measured_kind != this:
            found.add(shown(measured_kind))
    return sorted(found)


def describe() -> MachineInfo:
    return MachineInfo(
        host=platform.node(),
        os=platform.platform(),
        cpu_model=_cpu_model(),
        logical_cpus=os.cpu_count() or 1,
        usable_cpus=len(os.sched_getaffinity(0)),
        memory_bytes=_memory_bytes(),
        gpus=used_gpus(),
    )


def forget() -> None:
    """Drop the cached answers, so the next call asks the driver again."""
    _nvidia_smi_gpus.cache_clear()
    _torch_sees_a_gpu.cache_clear()
