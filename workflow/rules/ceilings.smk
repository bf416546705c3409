# Machine ceilings: measure each probe (one job, one results file each), then render the figure.
from workloads.ceilings import GPU_PROBES, PROBES, probes_for


rule ceilings_measure:
    """Measure one ceilings probe on this machine."""
    output:
        csv="results/{machine}/ceilings/{probe}-{scale}.csv",
        provenance="results/{machine}/ceilings/{probe}-{scale}.provenance.json",
    log:
        "logs/{machine}/ceilings/{probe}-{scale}.log",
    wildcard_constraints:
        # Only this machine's results are ever measured; other machines' are committed files.
        machine=re.escape(MACHINE),
        probe="|".join(PROBES),
    resources:
        # Measurements never overlap: one timing slot for all, and the GPU for GPU probes.
        timing_slot=1,
        gpu=lambda wc: int(wc.probe in GPU_PROBES or (HAS_GPU and wc.probe == "matmul")),
    params:
        python=PYTHON,
        config_file=CONFIG_FILE,
        scratch_dir=config["scratch_dir"],
    shell:
        "{params.python} -m workloads.ceilings --part {wildcards.probe} --scale {wildcards.scale}"
        " --out {output.csv} --config {params.config_file} --scratch-dir {params.scratch_dir}"
        " 2>&1 | tee {log}"


rule ceilings_figure:
    """Render the ceilings figure and summary table of one machine at one scale."""
    input:
        topic_results("ceilings", lambda: probes_for(HAS_GPU)),
        notebook="analysis/ceilings.py",
        helpers="analysis/common.py",
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
    params:
        python=PYTHON,
    shell:
        "{params.python} -m analysis.render {input.notebook} --executed {log.notebook}"
        " -p machine={wildcards.machine} -p scale={wildcards.scale}"
        " -p figure={output.figure} -p summary={output.summary}"


rule ceilings:
    """This machine's ceilings figure at the configured scale. The results are targets too, so
    a deleted results file is measured again (and the figure re-rendered)."""
    input:
        f"paper_figs/{MACHINE}/ceilings-{SCALE}.png",
        expand(f"results/{MACHINE}/ceilings/{{probe}}-{SCALE}.csv", probe=probes_for(HAS_GPU)),
