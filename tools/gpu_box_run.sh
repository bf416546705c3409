#!/usr/bin/env bash
# Measure on a GPU machine that has the GPU image's Python (torch, CuPy) but no Snakemake, as the
# committed H200 results were: runs the tests (GPU ones included), then every part of each
# topic at the given scale, exactly as the Snakemake rules call them.
#
#   tools/gpu_box_run.sh MACHINE SCALE OUT_DIR TOPIC [TOPIC...]
#
# Writes OUT_DIR/pytest.log, OUT_DIR/run.log and OUT_DIR/results-MACHINE.tgz (results/MACHINE/,
# re-packed after every part, so what finished comes back even if a later part is cut short).
# Set SUITE_GIT_COMMIT / SUITE_GIT_DIRTY to the commit you copied to the machine: they win over a
# .git copied along, which can be stale. SUITE_SKIP_TESTS=1 measures only; SUITE_PARTS="a b"
# measures only those parts; SUITE_RUN=N (N > 1) writes a re-run, as its own process, to
# results/MACHINE/TOPIC/reruns/runN/ (docs/measuring_on_a_gpu.md). SUITE_RUNS="1 2 3" (it wins
# over SUITE_RUN) measures each part in those runs, one process each, before the next part starts,
# so that a time limit leaves whole groups of processes. SUITE_COMPILE_CACHE=FILE.tgz: unpacked
# before the first part if it exists, and the compilers' caches (inductor, Triton, CuPy) packed
# into it after each part, for a machine that starts with empty caches (the first process after a
# cold start compiles everything and takes up to twice as long). Under `timeout`, a part cut short
# keeps the rows it measured.
set -uo pipefail
machine=${1:?machine name}; scale=${2:?scale}; out=${3:?output directory}; shift 3
runs=${SUITE_RUNS-${SUITE_RUN:-1}}
[ -n "${runs// /}" ] || { echo "SUITE_RUNS is empty: name the runs, e.g. SUITE_RUNS=\"1 2 3\"" >&2; exit 2; }
for run in $runs; do
  case $run in ''|0*|*[!0-9]*) echo "SUITE_RUN(S) must hold whole numbers from 1 (1: the committed run), not '$run'" >&2; exit 2;; esac
done
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SUITE_NO_PROGRESS=${SUITE_NO_PROGRESS:-1} CUPY_CACHE_DIR=$PWD/.cache/cupy
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cache=${SUITE_COMPILE_CACHE:-}
if [ -n "$cache" ]; then
  # Folders of this user's that the archive names by their full paths (the CuPy cache's is under
  # this checkout: restored only into a checkout at the same path).
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/suite-inductor-$(id -u)}
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/suite-triton-$(id -u)}
  if [ -f "$cache" ]; then
    tar xzf "$cache" -P && echo "compile caches unpacked from $cache" || echo "compile caches not unpacked from $cache" >&2
  fi
fi
cache_dirs=("${TORCHINDUCTOR_CACHE_DIR:-}" "${TRITON_CACHE_DIR:-}" "$CUPY_CACHE_DIR")
save_cache() {
  [ -n "$cache" ] || return 0
  local present=() d
  for d in "${cache_dirs[@]}"; do [ -n "$d" ] && [ -d "$d" ] && present+=("$d"); done
  [ ${#present[@]} -gt 0 ] && tar czf "$cache.tmp" -P "${present[@]}" && mv "$cache.tmp" "$cache"
}
# NVLink multicast off for anything NCCL starts here (the multi-GPU launcher sets these too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$out/gpu.txt"
if [ "${SUITE_SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -p no:cacheprovider -m "not slow" tests 2>&1 | tee "$out/pytest.log" | tail -15
fi
status=0
# A time limit's SIGTERM reaches the part too, which writes the rows it has (marked cut_short):
# pack them before going.
trap 'tar czf "$out/results-$machine.tgz" "results/$machine"; exit 124' TERM
for topic in "$@"; do
  parts=${SUITE_PARTS:-$(python3 -m workloads "$topic" --list-parts)} || { status=1; continue; }
  for part in $parts; do
    for run in $runs; do
      folder=results/$machine/$topic
      [ "$run" -gt 1 ] && folder=$folder/reruns/run$run
      start=$(date +%s)
      python3 -m workloads "$topic" --part "$part" --scale "$scale" \
          --out "$folder/$part-$scale.csv" 2>&1 | tee -a "$out/run.log" | tail -3 || status=1
      echo "$topic/$part (run $run): $(( $(date +%s) - start )) s" | tee -a "$out/run.log"
      tar czf "$out/results-$machine.tgz" "results/$machine"
    done
    save_cache
  done
done
exit $status
