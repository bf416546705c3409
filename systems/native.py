"""How the suite's CPU kernels are built and called: C++ files compiled once per machine.

A CPU kernel is a standalone C++ file (``systems/<system>/kernels/*.cpp``) with ``extern "C"``
entry points that take raw pointers. It is compiled with the system C++ compiler (``$CXX``, else
``g++``) into a shared library cached under ``~/.cache/data-efficient-suite/native`` by the
SHA-256 of source, flags and compiler, and called through ctypes with ``tensor.data_ptr()``.
The first build takes about a second; concurrent builds (parallel Snakemake jobs) each write a
temporary file and rename it, so none sees a half-written library.

Why not a torch C++ extension: it needs torch's headers and a minute per build; these kernels
need neither, and each has a numpy reference that the tests compare it with.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from harness.errors import UserError

FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror")
_by_path: dict[Path, ctypes.CDLL] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("SUITE_NATIVE_CACHE", Path.home() / ".cache" / "data-efficient-suite" / "native"))


def kernel_sources() -> list[Path]:
    """Every CPU kernel source file in the suite."""
    return sorted(Path(__file__).parent.glob("*/kernels/*.cpp"))


def load_library(source_path: Path) -> ctypes.CDLL:
    """The compiled library of ``source_path`` (built on first use on this machine; looked up
    once per process, since kernels are called per batch)."""
    loaded = _by_path.get(Path(source_path))
    if loaded is not None:
        return loaded
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if not compiler:
        raise UserError(f"building {source_path.name} needs a C++ compiler: install g++ or set CXX")
    source = Path(source_path).read_bytes()
    key = hashlib.sha256(b"\0".join([source, *(f.encode() for f in FLAGS), compiler.encode()])).hexdigest()[:16]
    target = cache_dir() / f"{Path(source_path).stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        build = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(source_path)], capture_output=True, text=True)
        if build.returncode != 0:
            raise RuntimeError(f"{compiler} could not build {source_path}:\n{build.stderr}")
        os.replace(partial, target)
    library = _by_path[Path(source_path)] = ctypes.CDLL(str(target))
    return library


def pointer(tensor) -> ctypes.c_void_p:
    """A CPU tensor's data address for a kernel argument (the tensor must be contiguous)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("native kernels take contiguous CPU tensors")
    return ctypes.c_void_p(tensor.data_ptr())
