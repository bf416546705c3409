"""The feature_gather workload: index generators; the gather variants' registry and what a part
does with it (selection, skipped variants and why, correctness checks, roles, options); each
part end to end at the tiny scale; the notebook on a variant it has never seen."""

import contextlib
import json

import pandas as pd
import pytest
import torch
from doctored_results import rewrite_rows

from harness.entry import main
from harness.errors import UserError, WrongResult
from harness.results import ResultsWriter, load, load_provenance
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS, GPU_TABLE, HOT_ROWS, Batch, GatherVariant
from workloads.feature_gather import TOPIC
from workloads.feature_gather.schema import SCHEMA
from workloads.feature_gather.sweep import Sweep, selected
from workloads.feature_gather.tables import HostTable, Popularity, uniform_rows, window_rows


def test_uniform_rows_are_distinct_and_in_range():
    g = torch.Generator().manual_seed(0)
    rows = uniform_rows(10_000, 3_000, g)
    assert rows.unique().numel() == 3_000 and rows.min() >= 0 and rows.max() < 10_000


def test_zipf_sample_is_distinct_and_prefers_popular_ranks():
    g = torch.Generator().manual_seed(1)
    popularity = Popularity(100_000, 1.0, g)
    ranks = popularity.sample_ranks(5_000)
    assert ranks.unique().numel() == 5_000
    # Under Zipf(1) the 1,000 most popular of 100,000 ranks hold about 60% of the weight: far
    # more of them are drawn than the 5% a uniform draw would give.
    assert (ranks < 1_000).float().mean() > 0.15
    assert (ranks < 100).sum() >= 90  # nearly all of the 100 most popular are in
    scattered = popularity.rows(ranks, "scattered")
    assert torch.equal(popularity.scattered[ranks], scattered)
    assert torch.equal(popularity.rows(ranks, "hot_first"), ranks)
    assert torch.equal(popularity.hottest_rows(10, "hot_first"), torch.arange(10))


def test_window_rows_stay_inside_their_windows():
    g = torch.Generator().manual_seed(2)
    rows = window_rows(num_rows=1 << 20, row_bytes=512, window_bytes=64 << 10, windows=32, n=2_000, generator=g)
    windows = (rows * 512) // (64 << 10)
    assert windows.unique().numel() <= 32 and rows.unique().numel() == 2_000
    with pytest.raises(ValueError, match="do not fit"):
        window_rows(1024, 512, 64 << 10, 1_000, 10, g)
    # A row wider than the window divided by zero; no window in the union timed an empty batch.
    with pytest.raises(UserError, match="^a window of 1024 B holds no row of 2048 B: widen window_kib$"):
        window_rows(1 << 20, 2048, 1024, 4, 10, g)
    with pytest.raises(UserError, match="^no window of 65536 B fits the union of rows"):
        window_rows(1 << 20, 512, 64 << 10, 0, 10, g)


# --- the registry and the sweep, on the CPU ------------------------------------------------------


def test_the_suites_variants_are_registered_with_their_roles():
    roles = {e.name: e.role for e in GATHER_VARIANTS}
    assert {n for n, r in roles.items() if r == "baseline"} == {"pageable", "cpu_gather", "cpu_gather_pipelined"}
    assert {n for n, r in roles.items() if r == "peer"} == {"torch_uva", "torch_uva_sorted", "wholegraph"}
    assert {n for n, r in roles.items() if r == "upper_bound"} == {"all_in_gpu"}
    assert GATHER_VARIANTS.names("optimized") == (
        "naive", "aligned", "vectorized", "sorted", "hot_cache", "split", "default", "vectorized_kernel",
    )  # fmt: skip
    assert GATHER_VARIANTS["wholegraph"].packages == ("pylibwholegraph",)
    assert GATHER_VARIANTS["vectorized_kernel"].kernel_only
    # The CPU gathers form one family: speedups are quoted against the faster of the two.
    assert {e.name for e in GATHER_VARIANTS if e.family == "CPU gather"} == {"cpu_gather", "cpu_gather_pipelined"}


def test_an_unknown_variant_in_the_config_is_one_line_listing_the_registered_ones():
    with pytest.raises(UserError) as err:
        selected(["cpu_gather", "cpu_gathr"])
    message = str(err.value)
    assert "\n" not in message and "unknown gather variant 'cpu_gathr'" in message and "torch_uva_sorted" in message
    with pytest.raises(UserError, match="must be 'all' or a list"):
        selected("cpu_gather")


@contextlib.contextmanager
def registered(*entries):
    """Entries in the registry for one test only."""
    for entry in entries:
        GATHER_VARIANTS.register(entry)
    try:
        yield
    finally:
        for entry in entries:
            GATHER_VARIANTS.unregister(entry.name)


def cpu_rows(b: Batch, *, split_fraction: float = 0.0, table_copy=None):
    """A CPU gather into the batch's staging buffer, reading from ``table_copy`` when given."""
    table = b.table if table_copy is None else table_copy

    def run():
        return torch.index_select(table, 0, b.idx, out=b.staging)

    return run


def cpu_sweep(names, writer, **kwargs):
    host = HostTable(1 << 20, "cpu", seed=3)
    return Sweep("demo", names, writer, host, repeat=2, warmup=0, device="cpu", **kwargs)


def test_a_row_larger_than_the_table_is_refused_in_one_line():
    """It made a table of no rows, "gathered" in no time, and the part failed on a zero bandwidth."""
    host = HostTable(1 << 20, "cpu", seed=3)
    with pytest.raises(
        UserError, match=r"^a row of 300000 fp32 features \(1200000 bytes\) does not fit a table of 1048576 bytes"
    ):
        host.view(4 << 20, "fp32", 300_000)
    assert host.view(4 << 20, "fp32", 200_000).shape == (1, 200_000)  # the buffer's bytes bound the table


def test_a_new_variant_is_checked_measured_and_recorded_with_its_role_and_options():
    """One case per behaviour of the sweep: a new entry runs with its role; one that needs a GPU,
    a cache of hot rows or a table copy it cannot make is skipped or left out with the reason;
    one that splits by two others' rates records the fraction; a wrong one is refused."""
    opened = []

    @contextlib.contextmanager
    def copy_of(table):
        if table.shape[1] > 64:
            raise RuntimeError("too wide for this copy")
        opened.append(table.clone())
        yield opened[-1]
        opened[-1] = None  # freed

    entries = (
        GatherVariant("demo_cpu", "optimized", make=cpu_rows, cpu_threads=True),
        GatherVariant("demo_gpu", "optimized", make=cpu_rows, needs_gpu=True),
        GatherVariant("demo_cached", "optimized", make=cpu_rows, requires=(HOT_ROWS,)),
        GatherVariant("demo_split", "optimized", make=cpu_rows, shares_from=("cpu_gather", "demo_cpu")),
        GatherVariant("demo_copy", "peer", make=cpu_rows, table_copy=copy_of, family="demo library"),
    )
    with registered(*entries):
        writer = ResultsWriter(SCHEMA, scale="tiny")
        sweep = cpu_sweep([e.name for e in entries] + ["cpu_gather"], writer)
        assert [e.name for e in sweep.entries] == ["demo_cpu", "demo_split", "demo_copy", "cpu_gather"]
        assert sweep.skipped == {
            "demo_gpu": "demo_gpu needs a CUDA GPU",
            "demo_cached": "demo_cached reads a GPU cache of hot rows, which part demo does not make",
        }
        for dim in (16, 100):
            table = sweep.host.view(1 << 20, "fp32", dim)
            batch = sweep.batch(table, uniform_rows(table.shape[0], 500, sweep.generator))
            config = {"dtype": "fp32", "dim": dim, "row_bytes": dim * 4, "table_bytes": table.numel() * 4}
            rates = sweep.run_batch(batch, config)
            sweep.run_table_copies(table, [(batch, config)])
        assert set(rates) == {"demo_cpu", "cpu_gather", "demo_split"}
        assert opened == [None]  # one copy made (the 64-column table), freed after its batches
        notes = sweep.notes()
        assert notes["variants_left_out"] == {"demo_copy": "1048400 B table left out: too wide for this copy"}
        sweep.close()
        rows = pd.DataFrame(writer.rows)
        roles = rows.groupby("variant").role.first().to_dict()
        assert roles == {
            "demo_cpu": "optimized",
            "demo_split": "optimized",
            "demo_copy": "peer",
            "cpu_gather": "baseline",
        }
        assert (rows[rows.variant == "demo_cpu"].threads == sweep.threads).all()  # every usable CPU, recorded
        split = rows[rows.variant == "demo_split"].split_fraction
        assert split.notna().all() and ((split > 0) & (split < 1)).all()

        wrong = GatherVariant("demo_wrong", "optimized", make=lambda b: lambda: torch.zeros_like(b.staging))
        with registered(wrong):
            sweep = cpu_sweep(["demo_wrong"], ResultsWriter(SCHEMA, scale="tiny"))
            table = sweep.host.view(1 << 20, "fp32", 8)
            batch = sweep.batch(table, uniform_rows(table.shape[0], 100, sweep.generator))
            with pytest.raises(WrongResult, match="variant 'demo_wrong' returned rows that differ"):
                sweep.run_batch(batch, {})
            del batch
            sweep.close()


def one_middle_row_wrong(b):
    def run():
        rows = torch.index_select(b.table, 0, b.idx)
        rows[rows.shape[0] // 2 + 1] += 1  # between rows a sample of evenly spaced ones would check
        return rows

    return run


def first_rows_handed_back(b):
    kept = []

    def run():
        if not kept:
            kept.append(torch.index_select(b.table, 0, b.idx))
        return kept[0]

    return run


def rows_gathered_when_built(b):
    rows = torch.index_select(b.table, 0, b.idx)  # a fresh copy on every call, never the same tensor
    return lambda: rows.clone()


def indices_sorted_in_place(b):
    def run():
        b.idx.copy_(b.idx.sort().values)  # rows in sorted order, checked against the sorted indices
        return torch.index_select(b.table, 0, b.idx)

    return run


@pytest.mark.parametrize(
    "make, refusal",
    [
        (indices_sorted_in_place, r"^feature_gather: variant 'demo_wrong' changed batch.idx \(the indices it was"),
        (
            rows_gathered_when_built,
            r"\(row \d+ first, \d+ of rows 0 to 4095 of 20011\): it must read batch.idx on every call",
        ),
        (
            one_middle_row_wrong,
            r"returned rows that differ from the table \(row 10006 first, 1 of rows 8192 to 12287 of",
        ),
        (first_rows_handed_back, r"returned rows that differ from the table \(row 0 first, 4096 of rows 0 to 4095 of"),
        (lambda b: lambda: torch.index_select(b.table, 0, b.idx)[:-1], r"returned \(20010, 8\) torch.float32; the"),
        (lambda b: lambda: torch.index_select(b.table, 0, b.idx).double(), r"returned \(20011, 8\) torch.float64"),
        (lambda b: lambda: None, r"returned NoneType; the batch's rows are \(20011, 8\) torch.float32"),
    ],
    ids=["sorted_in_place", "gathered_when_built", "one_middle_row", "handed_back", "a_row_short", "float64", "none"],
)
def test_every_row_of_every_call_is_checked_and_a_wrong_result_is_one_line(make, refusal):
    assert_refused(GatherVariant("demo_wrong", "optimized", make=make), refusal)


def assert_refused(variant: GatherVariant, refusal: str) -> None:
    """``variant`` alone, on a batch of 20011 rows of a 1 Mi-row table, is refused with ``refusal``."""
    with registered(variant):
        sweep = cpu_sweep([variant.name], ResultsWriter(SCHEMA, scale="tiny"))
        table = sweep.host.view(1 << 20, "fp32", 8)
        batch = sweep.batch(table, uniform_rows(table.shape[0], 20011, sweep.generator))
        with pytest.raises(WrongResult, match=refusal):
            sweep.run_batch(batch, {})
        del batch
        sweep.close()


def test_a_variant_whose_own_code_raises_keeps_its_traceback_and_its_last_line_names_it():
    def broken(b):
        def run():
            raise KeyError("a lookup in the user's own code")

        return run

    with registered(GatherVariant("demo_raises", "optimized", make=broken)):
        sweep = cpu_sweep(["demo_raises"], ResultsWriter(SCHEMA, scale="tiny"))
        table = sweep.host.view(1 << 20, "fp32", 8)
        batch = sweep.batch(table, uniform_rows(table.shape[0], 101, sweep.generator))
        with pytest.raises(KeyError) as error:
            sweep.run_batch(batch, {})
        assert error.value.__notes__ == ["(raised in feature_gather variant 'demo_raises' on 101 rows)"]
        del batch
        sweep.close()


def test_a_variant_is_refused_a_split_it_cannot_take_and_flags_it_does_not_know():
    with pytest.raises(ValueError, match="requires \\['gpu_memory'\\]"):
        GatherVariant("bad", "optimized", make=cpu_rows, requires=("gpu_memory",))
    with pytest.raises(ValueError, match="give make"):
        GatherVariant("bad", "optimized")
    alone = GatherVariant("demo_alone", "optimized", make=cpu_rows, shares_from=("cpu_gather", "demo_missing"))
    assert GPU_TABLE in GATHER_VARIANTS["all_in_gpu"].requires
    with registered(alone):
        sweep = cpu_sweep(["cpu_gather", "demo_alone"], ResultsWriter(SCHEMA, scale="tiny"))
        assert "not both measured in part demo" in sweep.skipped["demo_alone"]
        sweep.close()


# --- each part end to end ------------------------------------------------------------------------


def _run(tmp_path, part):
    out = tmp_path / f"{part}-tiny.csv"
    main(["feature_gather", "--part", part, "--scale", "tiny", "--out", str(out)])
    return load([out], SCHEMA), load_provenance(out)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    from harness import machine

    machine.forget()
    yield
    machine.forget()


@pytest.mark.parametrize("part", [p.name for p in TOPIC.parts_on(0)])
def test_cpu_part_writes_valid_results(tmp_path, part, no_gpu):
    frame, prov = _run(tmp_path, part)
    assert set(frame.variant) == {"cpu_gather"} and set(frame.device) == {"cpu"}
    assert set(frame.role) == {"baseline"}
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    assert prov["part"] == part and prov["variants"] == ["cpu_gather"]
    if part == "row_sizes":
        assert "dgl" in prov  # the reason DGL was not measured is recorded
        assert prov["variants_skipped"]["wholegraph"] == "wholegraph needs a CUDA GPU"
    assert set(prov["variants_skipped"]) == set(GATHER_VARIANTS.names()) - {"cpu_gather"}  # each with its reason


@pytest.mark.gpu
@pytest.mark.parametrize("part", TOPIC.part_names)
def test_gpu_part_writes_valid_results(tmp_path, part):
    frame, prov = _run(tmp_path, part)
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    roles = frame.groupby("variant").role.first()
    for name, role in roles.items():
        assert role == GATHER_VARIANTS[name].role
    if part == "table_sizes":
        assert {"naive", "vectorized", "sorted", "hot_cache", "split", "cpu_gather"} <= set(frame.variant)
        assert {"cpu_gather_pipelined", "torch_uva", "torch_uva_sorted"} <= set(frame.variant)
        assert roles["torch_uva"] == "peer" and roles["cpu_gather"] == "baseline"
        # WholeGraph is measured where it imports, and otherwise the reason is recorded.
        assert ("wholegraph" in set(frame.variant)) == ("wholegraph" not in prov.get("variants_skipped", {}))
        hits = frame[(frame.variant == "hot_cache") & (frame.metric == "pcie_bytes")]
        assert (hits.value < hits.batch_rows * hits.row_bytes).all()  # cached rows do not cross PCIe
        assert frame[frame.variant == "split"].split_fraction.notna().all()
    if part == "row_sizes":
        assert {"pageable", "all_in_gpu", "naive", "aligned", "torch_uva", "cpu_gather_pipelined"} <= set(frame.variant)
        assert roles["all_in_gpu"] == "upper_bound"
        assert not (frame[frame.variant == "all_in_gpu"].metric == "pcie_bytes").any()
        pipelined = frame[frame.variant == "cpu_gather_pipelined"]
        assert (pipelined.chunk_rows > 0).all() and (pipelined.threads > 0).all()
        assert frame[frame.variant == "default"].path.notna().all()
    if part == "thread_cap":
        capped = frame[frame.variant == "vectorized"]
        assert capped.max_threads.notna().all() and frame[frame.variant == "torch_uva"].max_threads.isna().all()


def test_gpu_parts_need_a_gpu(tmp_path, capsys, no_gpu):
    gpu_only = [p.name for p in TOPIC.parts if not p.cpu]
    assert gpu_only == ["table_sizes", "batch_sizes", "thread_cap", "locality"]
    for part in gpu_only:
        with pytest.raises(SystemExit):
            main(["feature_gather", "--part", part, "--scale", "tiny", "--out", str(tmp_path / "x.csv")])
        assert f"feature_gather part '{part}' needs 1 CUDA GPU and this machine has 0" in capsys.readouterr().err


GATHER_CASES = [pytest.param(100, 5_001, "fp32", id="dim100-fp32")] + [
    pytest.param(dim, n, dtype, id=f"dim{dim}-{dtype}", marks=pytest.mark.full)
    for dim, n in [(3, 1), (100, 5_001), (602, 4_099)]
    for dtype in ("fp32", "bf16")
    if (dim, dtype) != (100, "fp32")
]


@pytest.mark.gpu
@pytest.mark.parametrize("dim, n, dtype", GATHER_CASES)
def test_every_path_delivers_the_rows_into_a_poisoned_output(monkeypatch, dim, n, dtype):
    """Each baseline, peer and zero-copy path against table[idx], on an odd batch; the pipelined
    CPU gather with chunks of a few rows, so the two staging buffers take many turns."""
    from systems.pytorch_direct.gather_variants import cpu_baselines
    from workloads.feature_gather.tables import DTYPES

    monkeypatch.setattr(cpu_baselines, "PIPELINE_CHUNK_BYTES", 7 * dim * DTYPES[dtype].itemsize)
    host = HostTable(64 << 20, "cuda", seed=5)
    try:
        table = host.view(64 << 20, dtype, dim)
        g = torch.Generator().manual_seed(dim)
        idx = torch.randperm(table.shape[0], generator=g)[:n].pin_memory()
        batch = Batch(table=table, idx=idx, device="cuda", alias=host.cuda_view(table))
        expected = table[idx].cuda()
        names = ("cpu_gather", "cpu_gather_pipelined", "torch_uva", "torch_uva_sorted", "naive", "vectorized", "sorted")
        for name in names:
            batch.out.fill_(float("nan"))  # poison: a row left unwritten cannot pass
            got = GATHER_VARIANTS[name].build(batch, threads=2)()
            torch.cuda.synchronize()
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), name
        assert cpu_baselines.chunk_rows(batch) == 7
        del batch
    finally:
        host.close()


def test_the_pipelined_cpu_gather_needs_a_gpu():
    table = torch.rand(100, 4)
    batch = Batch(table=table, idx=torch.arange(10), device="cpu")
    with pytest.raises(ValueError, match="without a GPU it is cpu_gather"):
        GATHER_VARIANTS["cpu_gather_pipelined"].build(batch)


# --- the notebook ----------------------------------------------------------------------------------


def test_the_notebook_shows_a_variant_it_has_never_seen(tmp_path, no_gpu):
    """Tiny CPU results plus rows of a variant no registry knows (role optimized): it is in the
    summary's tables and speedups, and in the figure's legend, in its stable colour."""
    pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")
    from analysis.render import main as render

    out = tmp_path / "row_sizes-tiny.csv"
    main(["feature_gather", "--part", "row_sizes", "--scale", "tiny", "--out", str(out)])
    rows = pd.read_csv(out, keep_default_na=False, dtype=str)
    unseen = rows[rows.variant == "cpu_gather"].assign(variant="halved_gather", role="optimized")
    rewrite_rows(out, pd.concat([rows, unseen]))
    figure, summary = tmp_path / "fg.png", tmp_path / "fg.md"
    render(
        ["analysis/feature_gather.py", "--executed", str(tmp_path / "nb.ipynb"), "-p", "machine=test"]
        + ["-p", "scale=tiny", "--topic", "feature_gather", "--results", f"feature_gather={out}"]
        + ["--figure", str(figure), "--summary", str(summary)]
    )
    text = summary.read_text()
    row_sizes_header = next(line for line in text.splitlines() if line.startswith("| dtype | dim | row | "))
    assert row_sizes_header.endswith("| cpu_gather | halved_gather |")  # after the baseline: optimized
    assert "| x halved_gather |" in text  # a speedup over the fastest competitor (cpu_gather)
    assert "halved_gather" in text.split("CPU core-seconds per GB")[1]
    words = json.loads((tmp_path / "nb.text.json").read_text())[0]
    assert "halved_gather" in words  # the figure's legend
    # The title names only what is drawn: the row-size panel, not the table sizes nobody measured.
    assert "bandwidth of each path, by row size (bold: the suite's paths" in words[0]
    assert "table size" not in words[0]


@pytest.mark.parametrize("late", ["the tail", "a row rewritten"])
def test_a_variant_whose_thread_still_writes_after_it_returns_is_refused(monkeypatch, late):
    """Its thread writes once the variant has returned (sequenced here through the check's copy of
    the returned rows, so the race is the same on every run): the rows it returned are incomplete
    ("the tail": rows the thread had not written yet), or change after it returned ("a row
    rewritten")."""
    import threading

    from workloads.feature_gather import sweep as sweep_module

    returned, written = threading.Event(), threading.Event()
    real = sweep_module._as_returned

    def copy_then_let_the_thread_write(out):
        rows = real(out)
        returned.set()
        written.wait(timeout=60)
        return rows

    monkeypatch.setattr(sweep_module, "_as_returned", copy_then_let_the_thread_write)

    def racy(b):
        def run():
            returned.clear(), written.clear()
            n = b.idx.shape[0]
            out = b.staging[:n]
            head = n // 4 if late == "the tail" else n
            torch.index_select(b.table, 0, b.idx[:head], out=out[:head])

            def finish():
                returned.wait(timeout=60)
                if late == "the tail":
                    torch.index_select(b.table, 0, b.idx[head:], out=out[head:])
                else:
                    out[n // 2] += 1
                written.set()

            threading.Thread(target=finish, daemon=True).start()
            return out

        return run

    refusal = "returned rows that differ from the table" if late == "the tail" else "changed the rows it returned"
    assert_refused(GatherVariant("demo_racy", "optimized", make=racy), refusal)


def test_thread_counts_past_the_usable_cpus_are_left_out_and_said(no_gpu):
    """threads: [1, 100000] measured 1 and said nothing of 100000; [100000] alone ended in
    "no rows were measured"."""
    from harness.results import ResultsWriter
    from workloads.feature_gather import parts

    shared = {"batch_rows": 1024, "zipf_exponent": 1.0, "cache_fraction": 0.1}
    params = {"table_mib": 4, "row_bytes": [128], "threads": [1, 100000], "variants": ["cpu_gather"]}
    writer = ResultsWriter(SCHEMA, "tiny")
    notes = parts.cpu_threads(params, writer, shared=shared, repeat=1, warmup=0, device="cpu")
    assert notes["threads_left_out"] == {"100000": f"more than the {notes['usable_cpus']} usable CPUs"}
    assert {row["threads"] for row in writer.rows} == {1}
    words = r"^cpu_threads: threads \[100000\] are all more than the \d+ usable CPUs here$"
    with pytest.raises(UserError, match=words):
        parts.cpu_threads(
            params | {"threads": [100000]},
            ResultsWriter(SCHEMA, "tiny"),
            shared=shared,
            repeat=1,
            warmup=0,
            device="cpu",
        )
