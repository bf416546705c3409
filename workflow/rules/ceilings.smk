# Machine ceilings: measure each probe (one job, one results file each), then render the figure.
from workloads.ceilings import GPU_PROBES, PROBES, probes_for


def ceilings_results(wildcards):
    """This machine's results: the probes that apply here (measured if missing).
    Another machine's results: the files committed for it (never measured here)."""
    folder = f"results/{wildcards.machine}/ceilings"
    if wildcards.machine == MACHINE:
        return [f"{folder}/{probe}-{wildcards.scale}.csv" for probe in probes_for(HAS_GPU)]
    return [ancient(str(p)) for p in sorted(Path(folder).glob(f"*-{wildcards.scale}.csv"))]


rule ceilings_measure:
    """Measure one ceilings probe on this machine."""
    output:
        csv="results/{machine}/ceilings/{probe}-{scale}.csv",
        provenance="results/{machine}/ceilings/{probe}-{scale}.provenance.json",
    log:
        "logs/{machine}/ceilings/{probe}-{scale}.log",
    wildcard_constraints:
        machine=re.escape(MACHINE),
        probe="|".join(PROBES),
    resources:
        # Measurements never overlap: one timing slot for all, and the GPU for GPU probes.
        timing_slot=1,
        gpu=lambda wc: int(wc.probe in GPU_PROBES or (HAS_GPU and wc.probe == "matmul")),
    params:
        scratch_dir=config["scratch_dir"],
    shell:
        "{PYTHON} -m workloads.ceilings --probe {wildcards.probe} --scale {wildcards.scale}"
        " --out {output.csv} --config {CONFIG_FILE} --scratch-dir {params.scratch_dir}"
        " 2>&1 | tee {log}"


rule ceilings_figure:
    """Render the ceilings figure and summary table of one machine at one scale."""
    input:
        ceilings_results,
        notebook="analysis/ceilings.py",
    output:
        figure=report(
            "paper_figs/{machine}/ceilings-{scale}.png",
            caption="../report/ceilings.rst",
            category="Machine ceilings",
            labels={"machine": "{machine}", "scale": "{scale}"},
        ),
        summary="paper_figs/{machine}/ceilings-{scale}.md",
    log:
        notebook="logs/{machine}/notebooks/ceilings-{scale}.ipynb",
    shell:
        "{PYTHON} -m analysis.render {input.notebook} --executed {log.notebook}"
        " -p machine={wildcards.machine} -p scale={wildcards.scale}"
        " -p figure={output.figure} -p summary={output.summary}"


rule ceilings:
    """This machine's ceilings figure at the configured scale."""
    input:
        f"paper_figs/{MACHINE}/ceilings-{SCALE}.png",
