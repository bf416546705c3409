"""What every feature_gather part does with the gather variants of its config: pick them from the
registry (systems/pytorch_direct/gather_variants), leave out with a recorded reason those that
cannot run here or need what the part does not make, check each one's rows against the table,
time it, and write its rows with the role and configuration columns its entry gives.

A part's ``variants`` (config/feature_gather.yaml) is a list of registered names, or ``all``:
every registered variant the part can run, so that a new entry joins every such part.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import ExitStack, contextmanager

import torch

from harness.errors import UserError, WrongResult, raised_in
from harness.timing import measure
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS, GPU_TABLE, HOT_ROWS, Batch, GatherVariant
from workloads.feature_gather.tables import HostTable

ALL = "all"
CHECKED_ROWS = 4096  # rows compared at a time (every row is compared)
POISON = 0xA5  # a byte pattern random table rows do not repeat across a whole sample


def selected(names: str | Iterable[str]) -> list[GatherVariant]:
    """The entries a part's ``variants`` names (``all``: every registered one); an unknown name is
    a one-line UserError listing the registered ones."""
    if names == ALL:
        return list(GATHER_VARIANTS)
    if isinstance(names, str):
        raise UserError(f"feature_gather: variants must be '{ALL}' or a list of names, got {names!r}")
    return [GATHER_VARIANTS[name] for name in dict.fromkeys(names)]


class Sweep:
    """One part's variants, timing settings, writer and host table.

    ``accepts(entry)`` returns why the part does not measure an entry (or None); ``hot_rows``
    says whether the part makes GPU caches of hot rows (only skewed batches have them).
    """

    def __init__(
        self,
        part: str,
        names,
        writer,
        host: HostTable,
        *,
        repeat: int,
        warmup: int,
        device: str,
        seed: int = 0,
        accepts: Callable[[GatherVariant], str | None] = lambda entry: None,
        hot_rows: bool = False,
    ):
        self.part, self.writer, self.host = part, writer, host
        self.repeat, self.warmup, self.device = repeat, warmup, device
        gen_device = "cuda" if device == "cuda" else "cpu"
        self.generator = torch.Generator(device=gen_device).manual_seed(seed)
        self.threads = len(os.sched_getaffinity(0))
        self.skipped: dict[str, str] = {}  # variant -> why this part did not measure it
        self.left_out: dict[str, list[str]] = {}  # variant -> tables it could not hold
        self.entries: list[GatherVariant] = []
        for entry in selected(names):
            reason = entry.missing(device) or accepts(entry)
            if reason is None and HOT_ROWS in entry.requires and not hot_rows:
                reason = f"{entry.name} reads a GPU cache of hot rows, which part {part} does not make"
            if reason is None:
                self.entries.append(entry)
            else:
                self.skipped[entry.name] = reason
        # A variant that splits a batch by two others' rates runs only where both are measured first.
        plain = {e.name for e in self.plain()}
        for entry in [e for e in self.entries if e.shares_from and not set(e.shares_from) <= plain]:
            self.entries.remove(entry)
            self.skipped[entry.name] = (
                f"{entry.name} splits a batch by the rates of {' and '.join(entry.shares_from)}, "
                f"not both measured in part {part}"
            )
        self._gpu_copy = None

    # --- which entries run where ---------------------------------------------------------------

    def plain(self) -> list[GatherVariant]:
        """Entries that need nothing a batch does not have from the start."""
        return [e for e in self.entries if not (e.shares_from or e.table_copy or HOT_ROWS in e.requires)]

    def sharing(self) -> list[GatherVariant]:
        return [e for e in self.entries if e.shares_from and not e.table_copy]

    def hot(self) -> list[GatherVariant]:
        return [e for e in self.entries if HOT_ROWS in e.requires and not (e.shares_from or e.table_copy)]

    def copying(self) -> list[GatherVariant]:
        return [e for e in self.entries if e.table_copy]

    # --- batches ----------------------------------------------------------------------------------

    def batch(self, table: torch.Tensor, rows_on_gen_device: torch.Tensor) -> Batch:
        """A batch of ``rows`` of ``table``: indices in (pinned) host memory, the CUDA alias, and a
        GPU copy of the table when an entry reads one."""
        idx = rows_on_gen_device.to("cpu")
        if self.device == "cuda":
            idx = idx.pin_memory()
        gpu_table = None
        if any(GPU_TABLE in e.requires for e in self.entries):
            if self._gpu_copy is None:
                self._gpu_copy = self.host.buffer.to("cuda")  # every table is a view of its first bytes
            nbytes = table.numel() * table.element_size()
            gpu_table = self._gpu_copy[:nbytes].view(table.dtype).view(table.shape)
        return Batch(table=table, idx=idx, device=self.device, alias=self.host.cuda_view(table), gpu_table=gpu_table)

    def close(self) -> None:
        """Free the GPU copy and unpin the host table; the part has dropped its batches."""
        self._gpu_copy = None
        self.host.close()

    # --- measuring ----------------------------------------------------------------------------------

    def run_batch(self, batch: Batch, config: dict, **options) -> dict[str, float]:
        """Every plain entry on ``batch``, then those that split by their rates: the rates (GB/s)."""
        rates = {e.name: self.run(e, batch, config, **options) for e in self.plain()}
        for entry in self.sharing():
            cpu, gpu = (rates[name] for name in entry.shares_from)
            fraction = round(cpu / (cpu + gpu), 3)
            rates[entry.name] = self.run(
                entry, batch, config | {"split_fraction": fraction}, split_fraction=fraction, **options
            )
        return rates

    def run_hot(self, batch: Batch, config: dict, hot: torch.Tensor) -> None:
        """The entries that read a GPU cache of hot rows, with the rows ``hot`` cached; rows
        served from the cache are not counted as PCIe traffic."""
        if not self.hot():
            return
        from systems.pytorch_direct.ops import gather  # the zero-copy gather fills GiB-sized caches fast

        table = batch.table
        batch.slots = torch.full((table.shape[0],), -1, dtype=torch.int32, device="cuda")
        batch.slots[hot] = torch.arange(hot.numel(), dtype=torch.int32, device="cuda")
        batch.cache = gather(table, hot)
        misses = int((batch.slots[batch.idx.to("cuda")] < 0).sum())
        for entry in self.hot():
            cached = config | {"cache_bytes": hot.numel() * batch.row_bytes}
            self.run(entry, batch, cached, pcie_bytes=misses * batch.row_bytes)
        batch.slots = batch.cache = None

    def run_table_copies(self, table: torch.Tensor, runs: list[tuple[Batch, dict]], **options) -> None:
        """The entries that gather from their own copy of ``table``, on each (batch, config): one
        copy per entry, made outside timing and freed after. A table an entry cannot hold (its
        copy doubles the host memory) is left out for that entry, recorded, not the part."""
        for entry in self.copying():
            with ExitStack() as stack:
                try:
                    copy = stack.enter_context(entry.table_copy(table))
                except RuntimeError as err:
                    nbytes = table.numel() * table.element_size()
                    self.left_out.setdefault(entry.name, []).append(f"{nbytes} B table left out: {err}")
                    continue
                for batch, config in runs:
                    self.run(entry, batch, config, table_copy=copy, **options)

    def run(
        self,
        entry: GatherVariant,
        batch: Batch,
        config: dict,
        *,
        threads: int | None = None,
        pcie_bytes: int | None = None,
        **options,
    ) -> float:
        """Check, then time one entry on one batch; returns its median bandwidth (GB/s). A
        CPU-threaded entry runs on ``threads`` CPU threads (default: every usable one), recorded."""
        full = {"device": self.device, "batch_rows": batch.idx.shape[0], **config}
        if entry.cpu_threads:
            threads = self.threads if threads is None else threads
            full["threads"] = threads
        if entry.records is not None:
            full |= entry.records(batch)
        with raised_in(f"feature_gather variant '{entry.name}' on {batch.idx.shape[0]} rows"):
            fn = entry.build(batch, threads=threads or 0, **options)
            try:
                check(fn, batch, entry.name)
                timing = {"repeat": self.repeat, "warmup": self.warmup}
                m = measure(fn, device="cuda" if entry.kernel_only else "cpu", **timing)
                check(fn, batch, entry.name)  # the rows are gathered again each call, not handed back
                if not entry.kernel_only:  # a kernel-only entry copies the indices once, when built
                    with _reordered(batch):
                        check(fn, batch, entry.name, reordered=True)
            finally:
                getattr(fn, "close", lambda: None)()
        self.writer.add_measurement(m, role=entry.role, variant=entry.name, config=full, bytes_moved=batch.bytes)
        crossed = batch.bytes if pcie_bytes is None else pcie_bytes
        if self.device == "cuda" and not entry.reads_gpu_memory_only:
            for rep in range(len(m.seconds)):
                self.writer.add(
                    role=entry.role,
                    variant=entry.name,
                    config=full,
                    metric="pcie_bytes",
                    value=float(crossed),
                    unit="B",
                    repetition=rep,
                )
        return batch.bytes / m.median / 1e9

    def notes(self) -> dict:
        """What the provenance records of the part's variants: those measured (with what their
        entries say of themselves, a library's version), those left out and why."""
        measured = [e.name for e in self.entries]
        described = {e.name: e.describe() for e in self.entries if e.describe is not None}
        notes: dict = {"variants": measured, "cpu_threads": self.threads}
        if described:
            notes["variant_versions"] = described
        if self.skipped:
            notes["variants_skipped"] = dict(self.skipped)
        if self.left_out:
            notes["variants_left_out"] = {name: "; ".join(why) for name, why in self.left_out.items()}
        return notes


def check(run: Callable[[], torch.Tensor], batch: Batch, variant: str, *, reordered: bool = False) -> None:
    """Compare every row a variant returns with the reference ``table[idx]``, byte for byte: the
    rows as they were when it returned (a host copy of the batch), against the reference in chunks
    (which so never takes a whole batch's memory), and the rows once more after that, which must
    not have changed: a variant whose own threads still write them has returned too early.

    The batch's buffers are poisoned first: several variants write into the same ``out`` and
    staging buffers, so one that wrote nothing would otherwise pass on the rows the one before
    it left there. The rows returned are poisoned after the check, so a variant that hands back an
    earlier call's rows fails the check run again after timing (``run`` checks twice). ``run`` checks
    a third time with the batch's indices reordered in place (``reordered``): a variant must read
    ``batch.idx`` on every call, as a pipeline hands it new indices each batch, so one that gathered
    the rows once when it was built, and copies them out on each call, fails there. A variant must
    leave ``batch.idx`` as it found it: one that sorted it in place would be checked against its own
    order, and would hand its sorted indices to every variant timed after it."""
    batch.staging.view(torch.uint8).fill_(POISON)
    if batch.out is not None:
        batch.out.view(torch.uint8).fill_(POISON)
    given = batch.idx.clone()
    out = run()
    if batch.device == "cuda":
        torch.cuda.synchronize()  # a variant may still be writing where it should not
    returned = _as_returned(out)
    if not torch.equal(batch.idx, given):
        batch.idx.copy_(given)
        raise WrongResult(
            f"feature_gather: variant '{variant}' changed batch.idx (the indices it was given, in place): a variant "
            "must leave its inputs as it found them"
        )
    n, table = batch.idx.shape[0], batch.table
    if not isinstance(out, torch.Tensor) or out.shape != (n, *table.shape[1:]) or out.dtype != table.dtype:
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        wanted = f"{(n, *table.shape[1:])} {table.dtype}"
        raise WrongResult(f"feature_gather: variant '{variant}' returned {got}; the batch's rows are {wanted}")
    for start in range(0, n, CHECKED_ROWS):
        rows = slice(start, start + CHECKED_ROWS)
        got = returned[rows].contiguous().view(torch.uint8)
        expected = table[batch.idx[rows].cpu()].contiguous().view(torch.uint8)
        if not torch.equal(got, expected):
            differ = (got.view(got.shape[0], -1) != expected.view(expected.shape[0], -1)).any(dim=1)
            wrong = torch.nonzero(differ).flatten() + start
            raise WrongResult(
                f"feature_gather: variant '{variant}' returned rows that differ from the table (row {int(wrong[0])} "
                f"first, {wrong.numel()} of rows {start} to {min(start + CHECKED_ROWS, n) - 1} of {n})"
                + (": it must read batch.idx on every call (the indices were reordered)" if reordered else "")
            )
    if batch.device == "cuda":
        torch.cuda.synchronize()
    if not torch.equal(out.detach().cpu().contiguous().view(torch.uint8), returned.contiguous().view(torch.uint8)):
        raise WrongResult(
            f"feature_gather: variant '{variant}' changed the rows it returned after returning them: it must finish "
            "its work (join its threads, wait for its streams) before it returns"
        )
    if not _shares_memory(out, table):
        (out.view(torch.uint8) if out.is_contiguous() else out).fill_(POISON)


def _as_returned(out):
    """A host copy of the rows as they are the moment the variant returned: one that returns while
    its own threads still write them would pass a check reading the live rows after those threads
    ended, and be timed without their work (a GPU's queued work has been waited for already)."""
    return out.detach().to("cpu", copy=True) if isinstance(out, torch.Tensor) else out


@contextmanager
def _reordered(batch: Batch):
    """``batch.idx`` rotated by one place, in place (the same rows, so a cache of hot rows still
    holds them), and put back after."""
    if batch.device == "cuda":
        torch.cuda.synchronize()  # the timed calls may still read the pinned indices
    kept = batch.idx.clone()
    batch.idx.copy_(kept.roll(1))
    try:
        yield
    finally:
        if batch.device == "cuda":
            torch.cuda.synchronize()
        batch.idx.copy_(kept)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
