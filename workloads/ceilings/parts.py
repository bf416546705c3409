"""The measuring function of each ceilings part (see harness.topic): one module per probe."""

from workloads.ceilings import disk, hbm, host_memcpy, matmul, pcie, uva

pcie_copy = pcie.run
uva_read = uva.run
hbm_copy = hbm.run
matmul = matmul.run
disk = disk.run
host_memcpy = host_memcpy.run
