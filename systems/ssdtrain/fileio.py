"""Files on a real disk for the SSD stores: a private scratch folder, O_DIRECT transfers through
aligned bounce buffers, and one-line errors for what the user can fix.

O_DIRECT moves bytes between the buffer and the device without the page cache, so a transfer costs
what the disk costs (a host with more RAM than the activations would otherwise serve them from
DRAM: REFERENCE.md §5). It needs the buffer address, the file offset and the length aligned to the
device's logical block; ``ALIGN`` (4096 B) covers every common device, so each file holds its data
padded with zeros to a multiple of it. The true length is kept by the store that wrote the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from harness import resources
from harness.errors import UserError
from systems.ssdtrain._warn import warn

ALIGN = 4096
# Memory-backed file systems: their "files" are RAM. Before Linux 6.6 tmpfs refuses O_DIRECT
# (EINVAL); later kernels accept it and serve it from memory, so nothing would reach a disk.
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs")
# The kernel's views of itself: no disk behind them, and no files a store could write.
VIRTUAL_FILESYSTEMS = ("proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "securityfs", "configfs", "tracefs")


def align_up(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def filesystem_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (``ext4``, ``tmpfs``...), from the mount whose
    device number is the path's; None where /proc/self/mountinfo is missing or lacks it."""
    dev = os.stat(path).st_dev
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, tail = line.partition(" - ")
        if fields.split()[2] == wanted:
            return tail.split()[0]
    return None


def explain(err: OSError, path: Path, action: str) -> Exception:
    """What to raise for ``err`` while ``action`` on ``path``: a one-line UserError for what the
    user can fix (a full disk, a quota, a permission), else the OSError with the path named."""
    fixes = {
        errno.ENOSPC: "no space left on the device; free space there or pass a folder on another disk",
        errno.EFBIG: "the file is larger than the file system allows; pass a folder on another file system",
        errno.EDQUOT: "disk quota exceeded; free space there or pass a folder on another disk",
        errno.EACCES: "permission denied; pass a folder this user can write",
        errno.EPERM: "operation not permitted; pass a folder this user can write",
        errno.EROFS: "the file system is read-only; pass a writable folder",
    }
    if err.errno in fixes:
        return UserError(f"{action} {path} failed: {fixes[err.errno]}")
    return OSError(err.errno, f"{action} {path} failed: {err.strerror or err}")


SCRATCH_PREFIX = "ssdtrain-"
# Beside each scratch folder, ``<folder>.owner``: a file its store holds locked (flock) while open.
# A process that dies without closing its store (killed, out of memory) lets go of the lock, so the
# next store made in the same place finds the abandoned files and removes them.
OWNER = ".owner"


def owner_file(scratch: Path) -> Path:
    return scratch.with_name(scratch.name + OWNER)


def make_scratch(folder: Path, *, direct: bool) -> tuple[Path, int | None]:
    """A new private folder inside ``folder`` for one store's files, after checking that ``folder``
    exists (it is never created: a mistyped path would otherwise fill some other disk), is on a disk
    (not memory) and, with ``direct``, that its file system takes O_DIRECT. Only the private folder
    is made, and removed again when a check fails. Returns it with the descriptor that holds its
    owner lock (None on a file system without locks; remove_scratch closes it). Scratch folders
    that dead processes of this host left in ``folder`` are removed first, with a warning."""
    folder = Path(folder).expanduser()  # "~/scratch" as a shell reads it
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(f"{folder} {what}: pass an existing folder on a local disk (the store makes its own inside)")
    fs_type = filesystem_type(folder)
    if fs_type in VIRTUAL_FILESYSTEMS:
        raise UserError(
            f"{folder} is on {fs_type}, the kernel's virtual file system, not a disk: pass a folder on a local disk"
        )
    if fs_type in MEMORY_FILESYSTEMS:
        raise UserError(
            f"{folder} is on {fs_type}, which is memory, not a disk: O_DIRECT there fails (EINVAL) on "
            "kernels before 6.6 and is served from RAM on later ones; pass a folder on a local disk"
        )
    remove_abandoned(folder)
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=folder))
    except OSError as err:
        raise explain(err, folder, "creating a scratch folder in") from None
    owner = None
    try:
        owner = _lock_owner(scratch)
        if direct:
            _probe_direct(scratch / "probe")
    except BaseException:
        remove_scratch(scratch, owner)
        raise
    return scratch, owner


def _lock_owner(scratch: Path) -> int | None:
    """The descriptor holding ``scratch``'s owner lock, the owner file naming this host; None where
    the file system takes no locks (the folder is then never taken for an abandoned one)."""
    # Locked under another name and then renamed, so that no other process finds the owner file
    # before it is locked (and takes the new folder for an abandoned one).
    staging = owner_file(scratch).with_suffix(".new")
    fd = os.open(staging, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, _HOST.encode())
        staging.rename(owner_file(scratch))
    except OSError as err:
        os.close(fd)
        staging.unlink(missing_ok=True)
        if err.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise explain(err, staging, "locking") from None
    return fd


# A lock is only known to be let go where it was taken: a shared file system (NFS, a cluster's) may
# lock per node. Only folders this host made are ever reclaimed.
_HOST = socket.gethostname()


def remove_abandoned(folder: Path) -> None:
    """Remove the scratch folders in ``folder`` that this host made and whose owner lock no process
    holds: their store's process ended without closing it. A folder without an owner file (being
    made now, made by other code, on a file system without locks) or of another host is left alone."""
    removed, total = [], 0
    for owner in sorted(folder.glob(f"{SCRATCH_PREFIX}*{OWNER}")):
        try:
            fd = os.open(owner, os.O_RDWR | os.O_CLOEXEC)  # read-write: NFS grants an exclusive lock on no less
        except OSError:
            continue  # another user's, or gone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.pread(fd, 4096, 0).decode(errors="replace") != _HOST:
                raise BlockingIOError  # another host's: its lock says nothing here
        except OSError:
            os.close(fd)
            continue  # its store is open, or it is not this host's to judge
        scratch = owner.with_name(owner.name.removesuffix(OWNER))
        try:
            if scratch.is_dir() and not scratch.is_symlink():
                total += sum(f.stat().st_size for f in scratch.iterdir() if f.is_file())
                shutil.rmtree(scratch)
                removed.append(scratch.name)
            owner.unlink(missing_ok=True)
        except OSError:
            pass  # a file of another user's in it, or a read-only disk: left as it is
        finally:
            os.close(fd)
    if removed:
        warn(
            f"removed {len(removed)} scratch folder(s) in {folder} left by stores whose process ended without "
            f"closing them ({total / 2**20:.2f} MiB): {', '.join(removed)}"
        )


def _probe_direct(path: Path) -> None:
    """Write one aligned block with O_DIRECT, so a file system that refuses it fails here, once."""
    buffer = BounceBuffer(ALIGN, pin=False)
    buffer.tensor.zero_()
    fd = open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.pwrite(fd, buffer.array, 0)
    except OSError as err:
        raise explain(err, path, "writing a probe block to") from None
    finally:
        os.close(fd)
        path.unlink()


def open_direct(path: Path, flags: int) -> int:
    try:
        return resources.open_direct(path, flags, hint="pass a folder on a local disk (ext4, xfs)")
    except OSError as err:
        if err.errno == errno.ENOENT and flags & os.O_CREAT == 0:
            raise UserError(
                f"{path} is missing: the stored tensor's file was removed behind the store's back"
            ) from None
        if err.errno == errno.ENOENT:  # a new file's folder is gone
            raise UserError(
                f"{path.parent} is missing: the store's scratch folder was removed behind the store's back"
            ) from None
        raise explain(err, path, "opening") from None


def remove_scratch(scratch: Path, owner: int | None) -> None:
    """Remove a scratch folder and its owner file, then let go of the owner lock (if one was taken)."""
    shutil.rmtree(scratch, ignore_errors=True)
    if owner is not None:
        with contextlib.suppress(OSError):
            owner_file(scratch).unlink(missing_ok=True)
        os.close(owner)


class BounceBuffer:
    """``nbytes`` of host memory at an ``ALIGN``-aligned address, as O_DIRECT requires: a uint8
    tensor (page-locked with ``pin``, so device copies are direct DMA) and a NumPy view of the same
    bytes for ``os.pwrite`` / ``os.preadv``."""

    def __init__(self, nbytes: int, *, pin: bool):
        raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
        shift = -raw.data_ptr() % ALIGN
        self.tensor = raw[shift : shift + nbytes]
        self.array = self.tensor.numpy()


# stage(offset, n, block) fills or drains block (a uint8 tensor of n bytes) for bytes offset..offset+n.
Stage = Callable[[int, int, torch.Tensor], None]


def write_file(path: Path, nbytes: int, buffer: BounceBuffer, stage: Stage) -> int:
    """Write ``nbytes`` of data into a new file at ``path`` with O_DIRECT, one buffer-full at a time:
    ``stage`` fills each block, the last block is zero-padded to ``ALIGN``. Returns the bytes the
    file holds. On any failure the file is removed, so a failed write leaves nothing behind."""
    block = len(buffer.array)
    fd = open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        for offset in range(0, nbytes, block):
            n = min(block, nbytes - offset)
            padded = align_up(n)
            stage(offset, n, buffer.tensor[:n])
            buffer.tensor[n:padded].zero_()  # no stale bytes of an earlier tensor in the padding
            _write_all(fd, buffer.array[:padded], offset)
    except BaseException as err:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if isinstance(err, OSError):
            raise explain(err, path, "writing") from err
        raise
    os.close(fd)
    # No fsync: the bytes are on the device once pwrite returns (O_DIRECT), and nothing outlives
    # the process that would need the file's metadata to be durable.
    return align_up(nbytes)


def _write_all(fd: int, data, offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset``. A short write (the disk filled up, the file
    reached its size limit) is followed by a write of the rest, which fails with the reason
    (ENOSPC, EFBIG, EDQUOT): that error is raised, not a generic one. O_DIRECT needs aligned
    offsets, so the rest restarts at the last aligned byte written."""
    done, stalled = 0, False
    while done < len(data):
        written = os.pwrite(fd, data[done:], offset + done)
        progress = written - written % ALIGN
        if progress == 0:
            if stalled:  # twice nothing aligned, and the kernel gave no reason
                raise OSError(errno.EIO, f"the disk took {written} of {len(data) - done} bytes at {offset + done}")
            stalled = True
        done += progress


def read_file(path: Path, nbytes: int, buffer: BounceBuffer, stage: Stage) -> int:
    """Read the ``nbytes`` of data that ``write_file`` wrote at ``path``, one buffer-full at a time,
    handing each block to ``stage``. A missing file, or one of another size (truncated, replaced),
    raises naming it: the store never returns bytes it did not write. Returns the bytes read."""
    block = len(buffer.array)
    fd = open_direct(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != align_up(nbytes):
            raise UserError(
                f"{path} holds {size} bytes, not the {align_up(nbytes)} written ({nbytes} of data padded to "
                f"{ALIGN}): the file was truncated or replaced behind the store's back"
            )
        for offset in range(0, nbytes, block):
            n = min(block, nbytes - offset)
            padded = align_up(n)
            done = os.preadv(fd, [buffer.array[:padded]], offset)
            if done != padded:
                raise UserError(f"{path}: short read, {done} of {padded} bytes at offset {offset} (file truncated?)")
            stage(offset, n, buffer.tensor[:n])
    except OSError as err:
        raise explain(err, path, "reading") from err
    finally:
        os.close(fd)
    return align_up(nbytes)
