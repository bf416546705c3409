# Reproduction workflow of the data-efficient training suite.
#
#   snakemake --cores all reproduce    measure on this machine at config's scale, then render its figures
#   snakemake --cores all figures      re-render every figure from the committed results (no measuring)
#   snakemake --cores all ceilings     one figure (here: this machine's ceilings), measuring what is missing
#   snakemake --report report.html     an HTML report of every rendered figure with its caption
#
# Scale and machine: --config scale=tiny|cpu|h200 machine=NAME (see config/config.yaml).

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/ceilings.smk"


rule reproduce:
    """Measure every workload on this machine at the configured scale and render its figures."""
    input:
        rules.ceilings.input,


rule figures:
    """Render every figure from the results already in results/ (no measuring)."""
    input:
        committed_figures("ceilings", lambda: probes_for(HAS_GPU)),
