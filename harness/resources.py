"""Resource accounting: CPU core-seconds, host RSS, pinned host memory, peak GPU memory."""

from __future__ import annotations

import resource
import threading

_pinned_lock = threading.Lock()
_registered_pinned_bytes = 0


def cpu_core_seconds(include_children: bool = False) -> float:
    """User + system CPU time of this process, all threads together; with ``include_children``
    also that of its finished, waited-for child processes (e.g. DataLoader workers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    if include_children:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += children.ru_utime + children.ru_stime
    return total


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of resident memory (VmHWM) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not permitted in some sandboxes; the peak then covers the whole process
        pass


def peak_rss_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def note_registered_pinned(nbytes: int) -> None:
    """Called by code that page-locks memory in place (cudaHostRegister), +n on register, -n after."""
    global _registered_pinned_bytes
    with _pinned_lock:
        _registered_pinned_bytes += nbytes


def pinned_host_bytes() -> int:
    """Pinned host memory now: torch's pinned allocator plus memory registered in place."""
    allocator = 0
    try:
        import torch

        if torch.cuda.is_available() and hasattr(torch.cuda.memory, "host_memory_stats"):
            allocator = torch.cuda.memory.host_memory_stats().get("allocated_bytes.current", 0)
    except ImportError:
        pass
    return allocator + _registered_pinned_bytes
