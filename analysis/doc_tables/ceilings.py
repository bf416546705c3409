"""The ceilings doc's table: one line per ceiling, medians of the repetitions."""

from __future__ import annotations

from analysis.common import summarize
from analysis.doc_tables import Table, load, results_files, table

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
# How each host allocation of the zero-copy reads came about.
HOST_MEMORY = {
    "pinned": "from cudaHostAlloc",
    "registered": "registered in place",
    "registered_thp": "registered in 2 MiB THP",
}
DISK_MODE = {"write": "new file", "overwrite": "overwrite", "read": "read"}
PROBES = ("pcie_copy", "uva_read", "hbm_copy", "matmul", "disk", "host_memcpy")


def _gib(nbytes) -> str:
    return f"{nbytes / GiB:g}"


def _slashed(values, digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _span(values, digits: int = 1) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}–{high:.{digits}f}"


def ceilings_lines(machine: str, scale: str) -> Table:
    files = results_files(machine, "ceilings", PROBES, scale)
    frame = load(files, "ceilings")
    bw = summarize(
        frame,
        "bandwidth",
        ["part", "variant", "host_memory", "size_bytes", "table_bytes", "granularity_bytes", "block_bytes", "threads"],
    ).set_index(["part", "variant", "host_memory", "size_bytes", "table_bytes", "granularity_bytes"])["median"]
    rows = []

    pcie = bw.loc["pcie_copy"]
    largest = pcie.index.get_level_values("size_bytes").max()
    for memory in ("pinned", "pageable"):
        rates = [pcie.xs((direction, memory, largest), level=[0, 1, 2]).iloc[0] for direction in ("h2d", "d2h")]
        rows.append((f"{memory} host→device / device→host copy, {_gib(largest)} GiB", f"{_slashed(rates)} GB/s"))

    reads = bw.loc["uva_read"]
    tables = sorted(set(reads.index.get_level_values("table_bytes")))
    large = [t for t in tables if t >= GiB]

    def read(order, memory, row_bytes, table_bytes):
        return reads.xs((order, memory, table_bytes, row_bytes), level=[0, 1, 3, 4]).iloc[0]

    random_2k = [read("random", "pinned", 2 * KiB, t) for t in tables]
    rows.append(
        (
            f"GPU zero-copy read, 2 KiB rows, random, any table {_gib(tables[0])}–{_gib(tables[-1])} GiB",
            f"{_span(random_2k)} GB/s",
        )
    )
    sizes = " / ".join(_gib(t) for t in large)
    for row_bytes in (512, 128):
        rows.append(
            (
                f"GPU zero-copy read, {row_bytes} B rows, random, table {sizes} GiB",
                f"{_slashed(read('random', 'pinned', row_bytes, t) for t in large)} GB/s",
            )
        )
        rows.append(("same, indices sorted", f"{_slashed(read('sorted', 'pinned', row_bytes, t) for t in large)} GB/s"))
    contiguous = reads.xs(("contiguous", "pinned"), level=[0, 1])
    grains = sorted(set(contiguous.index.get_level_values("granularity_bytes")))
    rows.append(
        (
            f"GPU zero-copy read, contiguous rows ({grains[0]} B–{grains[-1] // KiB} KiB), any table size",
            f"{_span(contiguous, 0)} GB/s",
        )
    )
    memories = [m for m in ("pinned", "registered", "registered_thp") if m in set(reads.index.get_level_values(1))]
    biggest_16 = 16 * GiB if 16 * GiB in tables else tables[-1]
    rows.append(
        (
            f"512 B random reads, {_gib(biggest_16)} GiB table, host memory "
            + " / ".join(HOST_MEMORY[m] for m in memories),
            f"{_slashed(read('random', m, 512, biggest_16) for m in memories)} GB/s",
        )
    )

    hbm = bw.loc["hbm_copy"]
    rows.append(("HBM device-to-device copy (bytes read + written)", f"{hbm.max() / 1e3:.2f} TB/s"))

    rates = summarize(frame, "flop_rate", ["variant", "matrix_dim"])
    dim = rates.matrix_dim.max()
    flops = rates[rates.matrix_dim == dim].set_index("variant")["median"]
    kinds = [k for k in ("bf16", "tf32", "fp32") if k in flops.index]
    rows.append((f"matmul n={dim}: {' / '.join(kinds)}", f"{' / '.join(f'{flops[k]:.0f}' for k in kinds)} TFLOP/s"))

    disk = summarize(frame[frame.part == "disk"], "bandwidth", ["variant", "block_bytes", "threads"])
    # 16 MiB requests, the size an offload store writes, where measured; else the largest.
    block = 16 * MiB if (disk.block_bytes == 16 * MiB).any() else disk.block_bytes.max()
    one = disk[(disk.block_bytes == block) & (disk.threads == 1)].set_index("variant")["median"]
    modes = [m for m in ("write", "overwrite", "read") if m in one.index]
    rows.append(
        (
            f"disk, O_DIRECT, {block // MiB} MiB requests, 1 thread: " + " / ".join(DISK_MODE[m] for m in modes),
            f"{_slashed((one[m] for m in modes), 2)} GB/s",
        )
    )

    memcpy = summarize(frame[frame.part == "host_memcpy"], "bandwidth", ["size_bytes", "threads"])
    threads = sorted({1, int(memcpy.threads.max())})
    by_threads = memcpy.set_index("threads")["median"]
    rows.append(
        (
            f"host memcpy {_gib(memcpy.size_bytes.max())} GiB (read + write), {' / '.join(map(str, threads))} threads",
            f"{_slashed(by_threads[t] for t in threads)} GB/s",
        )
    )

    lines = ["| ceiling | measured |", "|---|---|", *(f"| {what} | {value} |" for what, value in rows)]
    return Table(lines, files, note="Medians of the repetitions of each configuration (GB/s: 10^9 bytes per second).")


@table("ceilings-h200", topic="ceilings")
def ceilings_h200() -> Table:
    return ceilings_lines("h200", "h200")
