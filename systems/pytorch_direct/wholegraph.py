"""NVIDIA WholeGraph (``pylibwholegraph``) as a peer: its gather from a host-mapped feature table.

WholeGraph is the production descendant of zero-copy feature gathering. A WholeMemory tensor of
type ``continuous`` in location ``cpu`` is one range of host memory that GPU kernels read through
one pointer. Per WholeGraph's source (``cpp/src/wholememory/memory_handle.cpp``), the first rank
allocates it as shared memory (System V ``shmget``/``shmat``; POSIX ``shm_open`` when
``WG_USE_POSIX_SHM`` is set), zero-fills it, and pins it in place with ``cudaHostRegister``
(default flags: mapped and portable under UVA). Its gather (``wholememory_gather``) gives each row
a warp or a sub-warp, with 16-byte loads where the alignment allows. For tables in host memory
with rows of at most 512 bytes it first sorts the indices on the GPU (a cub radix sort that keeps
each row's position), reads the rows in ascending order, and writes each row back to its place.
That is the ``sorted`` step of this suite's ablation, done inside the library.

Here it runs in one process on one GPU. The communicator has world size 1 and comes from a fresh
unique id (no ``torch.distributed``, no launcher), and ``NCCL_NVLS_ENABLE=0`` keeps NVLink
multicast off. The table's rows are copied into WholeGraph's memory once, outside timing, so a
table takes twice its size in host memory while its copy lives; ``close()`` frees the copy.
Rows are stored as integers of the table's element width (fp32 as int32, bf16 as int16).
WholeGraph converts floating-point rows through ``float``, which can change NaN bit patterns, and
random-byte bf16 tables hold NaNs. Integer storage makes the gather copy the bytes unchanged, with
the same row size, alignment and loads.

``available()`` returns None when WholeGraph imports and can create that communicator, and
otherwise the reason, in one line, for the provenance record.
"""

from __future__ import annotations

import atexit
import ctypes
import glob
import os
import weakref
from collections.abc import Callable

import torch

from harness import machine, resources
from systems.pytorch_direct.gather_variants import Batch, wait

MEMORY_TYPE = "continuous"
MEMORY_LOCATION = "cpu"  # host memory, mapped for the GPU
LOG_LEVEL = "warn"  # WholeGraph's own logging: error, warn, info, debug or trace
SORTED_GATHER_MAX_ROW_BYTES = 512  # host tables with rows up to this size are gathered in sorted order
STORAGE_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # by element size
INDEX_DTYPES = (torch.int32, torch.int64)

# CUDA libraries that libraft and libwholegraph need, by soname. Their RPATHs point into the
# site-packages they were installed into, so a `pip install --target` elsewhere cannot find
# them there; torch usually has them loaded already, and otherwise they come from the `nvidia`
# wheels (see _preload_cuda_libraries).
CUDA_SONAMES = (
    "libnvJitLink.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcusparse.so.12",
    "libcurand.so.10",
    "libcusolver.so.12",
    "libnccl.so.2",
)


class WholeGraphUnavailable(RuntimeError):
    """WholeGraph cannot run in this process; the message says why, in one line."""


class _State:
    def __init__(self):
        self.modules = None  # (pylibwholegraph.torch, its wholememory_binding)
        self.comm = None  # the process's single-rank WholeMemoryCommunicator
        self.device = None
        self.error: str | None = None  # why no communicator could be made (kept: NCCL is not retried)
        self.tables = weakref.WeakSet()  # open WholeGraphTables, closed before the communicator


_state = _State()


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _preload_cuda_libraries() -> None:
    """Load each library in CUDA_SONAMES that the loader cannot already find, from the `nvidia`
    wheels (``nvidia/<package>/lib`` or ``nvidia/cu13/lib``). A library already loaded under
    that soname (by torch) is used as it is."""
    try:
        import nvidia

        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for soname in CUDA_SONAMES:
        try:
            ctypes.CDLL(soname)
            continue
        except OSError:
            pass
        for root in roots:
            found = sorted(glob.glob(os.path.join(root, "*", "lib", soname)))
            if found:
                try:
                    ctypes.CDLL(found[0])
                    break
                except OSError:
                    continue


def _import():
    if _state.modules is None:
        _preload_cuda_libraries()
        import pylibwholegraph.torch as wgth
        from pylibwholegraph.binding import wholememory_binding as wmb

        _state.modules = (wgth, wmb)
    return _state.modules


def _library_error() -> str | None:
    """Why libraft.so or libwholegraph.so does not load, if one of them does not: the wheels'
    loaders swallow that error, and the import then fails on a later, vaguer one."""
    for package, soname in (("libraft", "libraft.so"), ("libwholegraph", "libwholegraph.so")):
        try:
            module = __import__(package)
            ctypes.CDLL(os.path.join(os.path.dirname(module.__file__), "lib64", soname))
        except OSError as err:
            return f"{soname}: {str(err).splitlines()[0][:200]}"
        except Exception:
            continue
    return None


def version() -> str | None:
    """pylibwholegraph's version, or None when it does not import."""
    try:
        _import()
        import pylibwholegraph
    except Exception:
        return None
    return str(pylibwholegraph.__version__)


def _communicator():
    """The process's single-rank communicator, created on the current GPU on first use."""
    if _state.comm is not None:
        return _state.comm
    if _state.error is not None:
        raise WholeGraphUnavailable(_state.error)
    try:
        wgth, wmb = _import()
    except Exception as err:
        cause = _library_error()
        _state.error = f"pylibwholegraph not importable ({_one_line(err)}{f'; {cause}' if cause else ''})"
        raise WholeGraphUnavailable(_state.error) from err
    if not machine.has_gpu():
        raise WholeGraphUnavailable("no CUDA GPU (WholeGraph gathers into GPU memory)")
    where = "the GPU"
    try:
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # one GPU: NVLink multicast stays off
        torch.cuda.init()
        device = torch.cuda.current_device()
        where = f"cuda:{device}"
        wgth.init(0, 1, 0, 1, wm_log_level=LOG_LEVEL)  # wholememory_init and the world's ranks
        comm = wgth.WholeMemoryCommunicator(wmb.create_communicator(wmb.create_unique_id(), 0, 1))
        if not comm.support_type_location(MEMORY_TYPE, MEMORY_LOCATION):
            wgth.destroy_communicator(comm)
            raise RuntimeError(f"the communicator does not support {MEMORY_TYPE} memory in location {MEMORY_LOCATION}")
    except Exception as err:
        _state.error = f"WholeGraph could not create a single-process communicator on {where} ({_one_line(err)})"
        raise WholeGraphUnavailable(_state.error) from err
    _state.comm, _state.device = comm, device
    atexit.register(_shutdown)
    return comm


def available() -> str | None:
    """None if WholeGraph imports and can create a single-process communicator on the current
    GPU; otherwise why not, in one line (for the provenance record)."""
    try:
        _communicator()
    except WholeGraphUnavailable as err:
        return str(err)
    return None


def _shutdown() -> None:
    """At exit: free every table, then the communicator (which would free them itself, after
    which their own finalizers must not run)."""
    for table in list(_state.tables):
        table.close()
    if _state.comm is None:
        return
    wgth, wmb = _state.modules
    try:
        wgth.destroy_communicator(_state.comm)
        wmb.finalize()
    except Exception:
        pass
    _state.comm = None


def _destroy(tensor, nbytes: int) -> None:
    if _state.comm is None:  # the communicator has gone, and took the memory with it
        return
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # queued gathers may still read the memory
    wgth, _ = _state.modules
    wgth.destroy_wholememory_tensor(tensor)
    resources.note_registered_pinned(-nbytes)


class WholeGraphTable:
    """A copy of a host table ``[rows, dim]`` in WholeGraph's host-mapped memory (``continuous``
    in location ``cpu``), gathered from the GPU with WholeGraph's own op.

    ``gather(idx)`` returns ``table[idx]`` in GPU memory for a CUDA int32/int64 ``idx`` of any
    shape and strides. ``close()`` (or the end of a ``with`` block, or garbage collection) frees
    WholeGraph's memory.
    """

    def __init__(self, table: torch.Tensor):
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(table).__name__}")
        if table.device.type != "cpu":
            raise ValueError(f"the table is on {table.device}; WholeGraphTable copies a host table")
        if table.dim() != 2 or table.shape[0] == 0 or table.shape[1] == 0:
            raise ValueError(f"the table must be 2-D [rows, features] and not empty, got {tuple(table.shape)}")
        if table.element_size() not in STORAGE_DTYPES or table.is_complex():
            raise ValueError(f"unsupported dtype {table.dtype}")
        comm = _communicator()
        wgth, _ = _state.modules
        self.shape = (int(table.shape[0]), int(table.shape[1]))
        self.dtype = table.dtype
        self.row_bytes = self.shape[1] * table.element_size()
        self.nbytes = self.shape[0] * self.row_bytes
        storage = STORAGE_DTYPES[table.element_size()]
        try:
            self._tensor = wgth.create_wholememory_tensor(
                comm, MEMORY_TYPE, MEMORY_LOCATION, list(self.shape), storage, None
            )
        except Exception as err:
            raise RuntimeError(
                f"WholeGraph could not allocate {self.nbytes} bytes of {MEMORY_TYPE} host memory ({_one_line(err)})"
            ) from err
        resources.note_registered_pinned(self.nbytes)
        self._release = weakref.finalize(self, _destroy, self._tensor, self.nbytes)
        _state.tables.add(self)
        try:
            view = self.host_view()
            self.address = view.data_ptr()
            view.copy_(table)  # the rows, once, outside timing
            del view
        except BaseException:
            self.close()
            raise

    @property
    def open(self) -> bool:
        return self._release.alive

    def _check_open(self) -> None:
        if not self.open:
            raise RuntimeError("this WholeGraphTable was closed; its memory is freed")

    def host_view(self) -> torch.Tensor:
        """WholeGraph's memory as a host tensor of the table's shape and dtype (no copy). Valid
        only until ``close()``: do not keep it past that."""
        self._check_open()
        view = self._tensor.get_global_tensor(host_view=True)
        view = view[0] if isinstance(view, tuple) else view
        if tuple(view.shape) != self.shape or view.stride() != (self.shape[1], 1):
            raise RuntimeError(f"WholeGraph's host view is {tuple(view.shape)} {view.stride()}, expected {self.shape}")
        return view.view(self.dtype)

    def gather(self, idx: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """``table[idx]`` in GPU memory, shaped ``idx.shape + (dim,)``, on ``idx``'s stream.

        ``check`` reads the smallest and largest index back first (one wait for the GPU) and
        raises ``IndexError`` if one is outside the table. WholeGraph itself checks nothing:
        it reads out-of-range rows from wherever they point and leaves the rows of negative
        indices unwritten.
        """
        self._check_open()
        if not isinstance(idx, torch.Tensor) or not idx.is_cuda or idx.dtype not in INDEX_DTYPES:
            raise TypeError("index a WholeGraphTable with an int32/int64 CUDA tensor of row ids")
        rows, dim = self.shape
        if idx.numel() == 0:
            return torch.empty((*idx.shape, dim), dtype=self.dtype, device=idx.device)
        flat = idx.reshape(-1).contiguous()  # WholeGraph reads a dense 1-D array from data_ptr()
        if check:
            low, high = (int(v) for v in torch.aminmax(flat))
            if low < 0 or high >= rows:
                raise IndexError(f"index {low if low < 0 else high} is out of range for a table of {rows} rows")
        with torch.cuda.device(flat.device):
            out = self._tensor.gather(flat)
        return out.view(self.dtype).view(*idx.shape, dim)

    def memory_report(self) -> dict:
        """How WholeGraph's memory was allocated: what CUDA and the kernel say of its address."""
        self._check_open()
        return {
            "memory_type": MEMORY_TYPE,
            "memory_location": MEMORY_LOCATION,
            "bytes": self.nbytes,
            "row_bytes": self.row_bytes,
            "gathers_sorted": self.row_bytes <= SORTED_GATHER_MAX_ROW_BYTES,
            **host_mapping(self.address),
        }

    def close(self) -> None:
        """Free WholeGraph's memory now (idempotent); waits for the GPU's queued work first."""
        self._release()

    def __enter__(self) -> WholeGraphTable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"WholeGraphTable(shape={self.shape}, dtype={self.dtype}, {state})"


def make_wholegraph(batch: Batch, table: WholeGraphTable | None = None) -> Callable[[], torch.Tensor]:
    """A gather with the gather variants' contract (systems/pytorch_direct/gather_variants): it
    copies ``batch.idx`` to the GPU, gathers the rows through WholeGraph (no bounds check, as
    WholeGraph's users call it), waits, and returns them.

    ``table`` is WholeGraph's copy of ``batch.table`` (one copy can serve many batches). If it is
    not given, one is made here, and the callable's ``close()`` frees it.
    """
    if batch.device != "cuda" or batch.idx_gpu is None:
        raise ValueError("WholeGraph gathers into GPU memory: it needs a batch on a CUDA device")
    owned = table is None
    wg = WholeGraphTable(batch.table) if owned else table
    if wg.shape != tuple(batch.table.shape) or wg.dtype != batch.table.dtype:
        raise ValueError(f"the WholeGraph table is {wg.shape} {wg.dtype}, the batch's {tuple(batch.table.shape)}")
    b = batch

    def run():
        b.idx_gpu.copy_(b.idx, non_blocking=True)
        out = wg.gather(b.idx_gpu, check=False)
        wait()
        return out

    run.table = wg
    run.close = wg.close if owned else (lambda: None)
    return run


# --- what the kernel and CUDA say about a host address ------------------------------------------

_SMAPS_FIELDS = (
    "Size",
    "Rss",
    "KernelPageSize",
    "MMUPageSize",
    "AnonHugePages",
    "ShmemPmdMapped",
    "FilePmdMapped",
    "Locked",
    "THPeligible",
    "VmFlags",
)


def _mapping_of(address: int) -> dict:
    """The /proc/self/smaps entry of the mapping that holds ``address``."""
    found, entry = False, {}
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                if found:
                    break
                start, end = (int(part, 16) for part in head[0].split("-"))
                if start <= address < end:
                    found = True
                    entry = {
                        "range": head[0],
                        "path": head[5].strip() if len(head) > 5 else "[anonymous]",
                        "inode": int(head[4]),
                    }
                continue
            if found:
                key, _, value = line.partition(":")
                if key in _SMAPS_FIELDS:
                    entry[key] = value.strip()
    return entry


def _numa_of(start: int) -> str | None:
    try:
        with open("/proc/self/numa_maps") as numa:
            for line in numa:
                if int(line.split(None, 1)[0], 16) == start:
                    return line.split(None, 1)[1].strip()
    except OSError:
        pass
    return None


def _sysv_segment(shmid: int) -> dict | None:
    try:
        with open("/proc/sysvipc/shm") as shm:
            names = shm.readline().split()
            for line in shm:
                row = dict(zip(names, line.split()))
                if row.get("shmid") == str(shmid):
                    return {k: row[k] for k in ("key", "shmid", "size", "nattch", "rss", "swap") if k in row}
    except OSError:
        pass
    return None


def thp_settings() -> dict:
    """The kernel's transparent-huge-page policies, for anonymous and for shared memory."""
    settings = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                settings[name] = f.read().strip()
        except OSError as err:
            settings[name] = f"unreadable ({err.strerror})"
    return settings


def host_mapping(address: int) -> dict:
    """What backs host ``address``: its mapping (path, page sizes, huge pages, locked bytes),
    NUMA placement, System V segment if any, and what CUDA reports for the pointer."""
    report: dict = {"address": hex(address)}
    try:
        mapping = _mapping_of(address)
    except OSError as err:
        mapping = {"unreadable": err.strerror}
    report["mapping"] = mapping
    if "range" in mapping:
        report["numa"] = _numa_of(int(mapping["range"].split("-")[0], 16))
        if mapping["path"].startswith("/SYSV"):
            report["sysv_segment"] = _sysv_segment(mapping["inode"])
    report["thp"] = thp_settings()
    try:
        import cupy

        attributes = cupy.cuda.runtime.pointerGetAttributes(address)
        report["cuda_pointer"] = {
            "type": int(getattr(attributes, "type", getattr(attributes, "memoryType", -1))),  # 1: host
            "device": int(attributes.device),
            "device_pointer_is_host_address": int(attributes.devicePointer) == address,
            "host_pointer_is_host_address": int(attributes.hostPointer) == address,
        }
    except Exception as err:
        report["cuda_pointer"] = f"not queried ({_one_line(err)})"
    return report
