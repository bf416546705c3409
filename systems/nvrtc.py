"""How every CUDA kernel in the suite is built and called (one mechanism for all systems).

* Kernels are standalone CUDA C++ files (``systems/<system>/kernels/*.cu``) with ``extern "C"``
  entry points and no torch or standard-library headers, so the same file compiles with NVRTC at
  run time and with ``nvcc`` in CI (``tests/test_kernels_compile.py`` builds every one for sm_90
  on machines without a GPU, so a broken kernel fails CI).
* At run time the source is compiled by NVRTC through CuPy for the current device's architecture.
  Modules are cached in the process by the SHA-256 of source and options, and CuPy keeps the
  compiled binaries on disk under the same kind of key (``CUPY_CACHE_DIR``, by default
  ``~/.cache/data-efficient-suite/cupy``), so a fresh process pays the compile once per machine.
* Launches go to the current torch stream, so kernels order correctly with torch work and with
  CUDA-event timing.
* Each kernel is exposed to Python as a ``torch.library`` custom op that also has a CPU reference
  implementation (see ``systems/zero_copy/ops.py`` for the pattern).

Why not a torch C++/CUDA extension: the CPU torch build cannot compile one, and on a fresh GPU box
each build costs about a minute; NVRTC compiles a kernel in well under a second.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

_modules: dict[str, object] = {}
_modules_by_path: dict[tuple[str, tuple[str, ...]], object] = {}  # no file read or hash per launch
_functions: dict[tuple[int, str], object] = {}
_streams: dict[tuple[int, int], object] = {}

DEFAULT_OPTIONS = ("--std=c++17",)
CUDA_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost


def kernel_sources() -> list[Path]:
    """Every kernel source file in the suite (CI compiles all of them)."""
    return sorted(Path(__file__).parent.glob("*/kernels/*.cu"))


def _cupy():
    os.environ.setdefault("CUPY_CACHE_DIR", str(Path.home() / ".cache" / "data-efficient-suite" / "cupy"))
    try:
        import cupy
    except ImportError:
        raise RuntimeError(
            "CUDA kernels need CuPy for NVRTC compilation (pip install cupy-cuda12x or cupy-cuda13x, "
            "see envs/requirements-gpu.txt)"
        ) from None
    return cupy


def load_module(source_path: Path, options: tuple[str, ...] = DEFAULT_OPTIONS):
    """Compile (or fetch from cache) the module in ``source_path`` for the current device.

    A path seen before returns its module without reading the file again: kernels are launched
    per call, and reading and hashing the source each time cost tens of microseconds."""
    by_path = (str(source_path), tuple(options))
    if by_path in _modules_by_path:
        return _modules_by_path[by_path]
    source = Path(source_path).read_text()
    key = hashlib.sha256("\0".join((source, *options)).encode()).hexdigest()
    module = _modules.get(key)
    if module is None:
        cupy = _cupy()
        module = cupy.RawModule(code=source, options=options, backend="nvrtc")
        module.compile()
        _modules[key] = module
    _modules_by_path[by_path] = module
    return module


def function(module, name: str):
    """The kernel ``name`` of ``module`` (looked up once)."""
    kernel = _functions.get((id(module), name))
    if kernel is None:
        kernel = _functions[(id(module), name)] = module.get_function(name)
    return kernel


def launch(module, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0) -> None:
    """Launch ``name`` from ``module`` on torch's current stream of the current device.

    ``args`` are numpy scalars of the kernel's exact parameter types; pass pointers as
    ``numpy.uint64(tensor.data_ptr())``.
    """
    with on_torch_stream():
        function(module, name)(grid, block, args, shared_mem=shared_mem)


def on_torch_stream():
    """A context in which CuPy launches go to torch's current stream of the current device. Code
    that launches many kernels in a row enters it once and calls :func:`function`'s kernels
    directly: looking the stream up costs microseconds per launch."""
    import torch

    stream = torch.cuda.current_stream()
    return cupy_stream(stream.device.index, stream.cuda_stream)


def cupy_stream(device: int, handle: int):
    """A CuPy view of a torch stream, made once per stream (it is used as a context manager)."""
    view = _streams.get((device, handle))
    if view is None:
        cupy = _cupy()
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream in favour of Stream.from_external, which needs
            # the stream protocol that not every torch version implements; both wrap the handle.
            warnings.simplefilter("ignore", DeprecationWarning)
            view = cupy.cuda.ExternalStream(handle, device)
        _streams[(device, handle)] = view
    return view


def device_pointer_of_pinned(tensor) -> int:
    """The device-side address of page-locked host memory (the same address under UVA)."""
    cupy = _cupy()
    attributes = cupy.cuda.runtime.pointerGetAttributes(tensor.data_ptr())
    memory_type = getattr(attributes, "type", getattr(attributes, "memoryType", None))
    if memory_type != CUDA_MEMORY_TYPE_HOST:
        raise ValueError("tensor is not in page-locked host memory known to the CUDA driver")
    return int(attributes.devicePointer)
