#!/usr/bin/env bash
# Measure on a GPU machine that has the GPU image's Python (torch, CuPy) but no Snakemake, as the
# committed H200 results were: runs the tests (GPU ones included), then every ceilings probe at
# the given scale, exactly as the Snakemake rules call them.
#
#   tools/gpu_box_run.sh MACHINE SCALE OUT_DIR
#
# Writes OUT_DIR/pytest.log, OUT_DIR/results-MACHINE.tgz (results/MACHINE/...) and a run log.
# Set SUITE_GIT_COMMIT / SUITE_GIT_DIRTY when the tree was copied without its git history.
set -uo pipefail
machine=${1:?machine name}; scale=${2:?scale}; out=${3:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SUITE_NO_PROGRESS=${SUITE_NO_PROGRESS:-1} CUPY_CACHE_DIR=$PWD/.cache/cupy
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$out/pytest.log" | tail -25
status=0
for probe in pcie_copy uva_read hbm_copy matmul disk host_memcpy; do
  start=$(date +%s)
  python3 -m workloads.ceilings --part "$probe" --scale "$scale" \
      --out "results/$machine/ceilings/$probe-$scale.csv" 2>&1 | tee -a "$out/run.log" | tail -3 || status=1
  echo "$probe: $(( $(date +%s) - start )) s" | tee -a "$out/run.log"
done
tar czf "$out/results-$machine.tgz" "results/$machine"
exit $status
