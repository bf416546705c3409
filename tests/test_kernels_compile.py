"""Every CUDA kernel of the suite compiles for sm_90 with nvcc, so CI catches a broken kernel
on machines without a GPU (at run time the same files go through NVRTC); every C++ CPU kernel
builds with the flags systems.native uses, warnings as errors."""

import os
import shutil
import subprocess

import pytest

from systems import native, nvrtc

KERNELS = nvrtc.kernel_sources()


def test_there_are_kernels_to_check():
    assert any(path.name == QUICK_KERNEL for path in KERNELS)


def _named(path):
    return f"{path.parent.parent.name}/{path.name}"


# One kernel in the quick tier (nvcc takes seconds each); every kernel in the full tier, which CI runs.
QUICK_KERNEL = "read_rows.cu"


@pytest.mark.parametrize(
    "source",
    [k if k.name == QUICK_KERNEL else pytest.param(k, marks=pytest.mark.full) for k in KERNELS],
    ids=_named,
)
def test_kernel_compiles_for_sm90(source, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile every kernel")
        pytest.skip("nvcc is not on PATH")
    result = subprocess.run(
        [
            nvcc,
            "-arch=sm_90",
            "--cubin",
            "-std=c++17",
            "-Werror",
            "all-warnings",
            "-o",
            str(tmp_path / "k.cubin"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "k.cubin").stat().st_size > 0


@pytest.mark.parametrize("source", native.kernel_sources(), ids=_named)
def test_cpu_kernel_builds_and_loads(source, tmp_path, monkeypatch):
    assert native.kernel_sources(), "no C++ kernels found"
    monkeypatch.setenv("SUITE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_by_path", {})
    library = native.load_library(source)
    assert list(tmp_path.glob(f"{source.stem}-*.so")) and library is not None


def test_a_cpu_kernel_that_does_not_compile_says_why(tmp_path, monkeypatch):
    broken = tmp_path / "broken.cpp"
    broken.write_text('extern "C" int f() { return undefined_name; }\n')
    monkeypatch.setenv("SUITE_NATIVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="undefined_name"):
        native.load_library(broken)
