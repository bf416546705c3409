"""Resource accounting: CPU core-seconds, host RSS, pinned host memory, peak GPU memory, and the
bytes a block device read and wrote (its own counters, whatever the page cache did)."""

from __future__ import annotations

import errno
import os
import resource
import threading
from pathlib import Path

_pinned_lock = threading.Lock()
_registered_pinned_bytes = 0

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SECTOR = 512  # /sys/block/*/stat counts 512-byte sectors whatever the device's own sector size


def cpu_core_seconds(include_children: bool = False) -> float:
    """User + system CPU time of this process, all threads together; with ``include_children``
    also that of its child processes (e.g. DataLoader workers), both the finished ones and, on
    Linux, the ones still running (persistent workers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    if include_children:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += children.ru_utime + children.ru_stime + _live_descendants_seconds(os.getpid())
    return total


def _live_descendants_seconds(pid: int) -> float:
    """CPU time of the running (not yet reaped) descendants of ``pid``, from /proc; 0 elsewhere."""
    total = 0.0
    for descendant in descendant_pids(pid):
        try:
            fields = Path(f"/proc/{descendant}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile: its time is in RUSAGE_CHILDREN once reaped
        # utime, stime, and the times of its own reaped children (fields 14-17 of proc(5)).
        total += sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS
    return total


def descendant_pids(pid: int) -> list[int]:
    """Every running descendant of ``pid`` (children, their children, ...), from /proc; [] elsewhere."""
    found = []
    for child in _children(pid):
        found += [child, *descendant_pids(child)]
    return found


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


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


def open_direct(path: Path, flags: int, *, hint: str) -> int:
    """``os.open`` with O_DIRECT (transfers bypass the page cache); a file system that refuses it
    (EINVAL) is a one-line UserError ending in ``hint``, what the user should do instead. Other
    errors are raised as they are, for the caller to explain."""
    from harness.errors import UserError

    try:
        return os.open(path, flags | os.O_DIRECT, 0o600)
    except OSError as err:
        if err.errno == errno.EINVAL:
            raise UserError(
                f"the file system holding {path.parent} refuses O_DIRECT ({path.name}: EINVAL); {hint}"
            ) from None
        raise


def block_device_counters(path: Path) -> Path | None:
    """The stat file of the block device holding ``path``; None if it is not on one (tmpfs, overlay)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return stat if stat.exists() else None


def device_bytes(stat: Path) -> tuple[int, int]:
    """(bytes read, bytes written) by the device since boot."""
    fields = stat.read_text().split()
    return int(fields[2]) * SECTOR, int(fields[6]) * SECTOR
