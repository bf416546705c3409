"""Every CUDA kernel of the suite compiles for sm_90 with nvcc, so CI catches a broken kernel
on machines without a GPU. (At run time the same files go through NVRTC.)"""

import os
import shutil
import subprocess

import pytest

from systems import nvrtc

KERNELS = nvrtc.kernel_sources()


def test_there_are_kernels_to_check():
    assert any(path.name == "read_rows.cu" for path in KERNELS)


@pytest.mark.parametrize("source", KERNELS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_kernel_compiles_for_sm90(source, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile every kernel")
        pytest.skip("nvcc is not on PATH")
    result = subprocess.run(
        [nvcc, "-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings", "-o", str(tmp_path / "k.cubin"), str(source)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "k.cubin").stat().st_size > 0
