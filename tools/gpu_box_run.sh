#!/usr/bin/env bash
# Measure on a GPU machine that has the GPU image's Python (torch, CuPy) but no Snakemake, as the
# committed H200 results were: runs the tests (GPU ones included), then every part of each
# topic at the given scale that the Snakemake rules run on this machine (those it can run, and
# that the topic's config has a block for at the scale), exactly as the rules call them.
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
#
# The arguments are checked before anything runs: the machine name (a folder name, as the
# workflow's config schema has it), the scale (one of config/config.yaml's, on a GPU if it needs
# one), the topics and SUITE_PARTS (parts of each topic that run here at the scale). The exit
# status is 0 only when the tests, every part and every packing of the archive succeeded (2: the
# arguments were refused and nothing ran).
set -uo pipefail
usage="usage: tools/gpu_box_run.sh MACHINE SCALE OUT_DIR TOPIC [TOPIC...]"
case ${1:-} in
  -h|--help) echo "$usage"; sed -n '2,/^set -uo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;;
esac
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
machine=$1; scale=$2; out=$3; shift 3
# workflow/schemas/config.schema.yaml's pattern for machine names: results/MACHINE is one folder.
[[ $machine =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || {
  echo "MACHINE must be one folder name (letters, digits, '.', '_', '-'; a letter or digit first), not '$machine'" >&2
  exit 2
}
runs=${SUITE_RUNS-${SUITE_RUN:-1}}
[ -n "${runs// /}" ] || { echo "SUITE_RUNS is empty: name the runs, e.g. SUITE_RUNS=\"1 2 3\"" >&2; exit 2; }
for run in $runs; do
  case $run in ''|0*|*[!0-9]*) echo "SUITE_RUN(S) must hold whole numbers from 1 (1: the committed run), not '$run'" >&2; exit 2;; esac
done
# Checked before the tests run (the parts would refuse them one by one, after the tests' minutes).
case ${SUITE_SKIP_TESTS:-0} in 0|1) ;; *) echo "SUITE_SKIP_TESTS must be 1 (measure only) or 0, not '$SUITE_SKIP_TESTS'" >&2; exit 2;; esac
if [ -n "${SUITE_GIT_COMMIT+set}" ] && ! [[ $SUITE_GIT_COMMIT =~ ^[0-9a-f]{7,64}$ ]]; then  # as harness/provenance.py
  echo "SUITE_GIT_COMMIT must be a commit hash (7 to 64 hex digits), not '$SUITE_GIT_COMMIT'" >&2; exit 2
fi
dirty=${SUITE_GIT_DIRTY-}
dirty=${dirty//[[:space:]]/}  # the harness strips it too
case ${dirty,,} in ''|0|1|true|false|yes|no) ;;
  *) echo "SUITE_GIT_DIRTY must be 1 or 0 (or true/false, yes/no), not '$SUITE_GIT_DIRTY'" >&2; exit 2;; esac
export PYTHONUNBUFFERED=1 SUITE_NO_PROGRESS=${SUITE_NO_PROGRESS:-1} CUPY_CACHE_DIR=$PWD/.cache/cupy
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The plan, one line per topic ("TOPIC PART..."): the parts that run on this machine and are
# configured at the scale (those the workflow runs here), or SUITE_PARTS. The configuration, the
# scale, the topics and SUITE_PARTS are refused here, in one line, where they are wrong.
plan=$(python3 - "$scale" "$@" <<'PY'
import os
import sys

from harness import config, entry, machine
from harness.errors import UserError
from harness.topic import discover

scale, names = sys.argv[1], sys.argv[2:]
chosen = os.environ.get("SUITE_PARTS", "").split()
try:
    cfg = config.load()
    if scale not in cfg["scales"]:
        raise UserError(f"unknown scale '{scale}': config/config.yaml has {', '.join(cfg['scales'])}")
    if cfg["scales"][scale].get("needs_gpu") and not machine.has_gpu():
        cpu = ", ".join(name for name, it in cfg["scales"].items() if not it.get("needs_gpu"))
        raise UserError(f"scale '{scale}' needs a CUDA GPU and torch sees none here (scales without one: {cpu})")
    topics, gpus = discover(), machine.gpu_count()
    for name in names:
        if name not in topics:
            raise UserError(f"unknown topic '{name}': the topics are {', '.join(topics)}")
        topic = topics[name]
        here = entry.listed_parts(topic, scale, config.DEFAULT_CONFIG)  # what `--list-parts --scale` prints
        for part in map(topic.part, chosen):  # refuses a part the topic does not have
            if part.name in here:
                continue
            if not part.fits_gpus(gpus):
                why = f"it needs {part.gpus} CUDA GPU(s) and torch sees {gpus}"
            elif part.cores > machine.usable_cores():
                why = f"it needs {part.cores} CPU cores and this process may use {machine.usable_cores()}"
            else:
                why = f"config/{name}.yaml gives it no block at scale '{scale}'"
            raise UserError(f"SUITE_PARTS: {name}/{part.name} does not run here: {why}")
        if not here:
            print(f"note: no part of {name} runs on this machine at scale '{scale}': left out", file=sys.stderr)
        print(name, *(chosen or here))
except UserError as err:
    sys.exit(f"error: {err}")
PY
) || exit 2
declare -A parts_of
while read -r topic parts; do parts_of[$topic]=$parts; done <<< "$plan"
[ -n "$(printf '%s' "${parts_of[@]}")" ] || { echo "no part of $* runs on this machine at scale '$scale': nothing to measure" >&2; exit 2; }
mkdir -p "$out" || exit 2
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
  [ ${#present[@]} -gt 0 ] || return 0
  # tar's status 1: a file changed while it was read (a compiler writing beside this run); what it
  # packed is whole, and the next machine compiles the rest again.
  tar czf "$cache.tmp" -P "${present[@]}"
  [ $? -le 1 ] && mv "$cache.tmp" "$cache"
}
# NVLink multicast off for anything NCCL starts here (the multi-GPU launcher sets these too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$out/gpu.txt"
status=0
if [ "${SUITE_SKIP_TESTS:-0}" != 1 ]; then
  # Failed tests do not stop the measuring, but the exit status says so.
  python3 -m pytest -q -p no:cacheprovider -m "not slow" tests 2>&1 | tee "$out/pytest.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the tests failed ($out/pytest.log): measuring all the same, exit status 1" >&2; status=1; }
fi
archive=$out/results-$machine.tgz
pack() {
  tar czf "$archive" "results/$machine" || { echo "results/$machine could not be packed into $archive" >&2; status=1; }
}
# A time limit's SIGTERM reaches the part too, which writes the rows it has (marked cut_short):
# pack them before going.
trap 'pack; exit 124' TERM
for topic in "$@"; do
  for part in ${parts_of[$topic]}; do
    for run in $runs; do
      folder=results/$machine/$topic
      [ "$run" -gt 1 ] && folder=$folder/reruns/run$run
      start=$(date +%s)
      python3 -m workloads "$topic" --part "$part" --scale "$scale" \
          --out "$folder/$part-$scale.csv" 2>&1 | tee -a "$out/run.log" | tail -3 || status=1
      echo "$topic/$part (run $run): $(( $(date +%s) - start )) s" | tee -a "$out/run.log"
      pack
    done
    save_cache
  done
done
exit $status
