# Reproduction workflow of the data-efficient training suite.
#
#   snakemake --cores all reproduce    measure on this machine at config's scale, then render its figures
#   snakemake --cores all figures      re-render every figure from the results in results/ (no measuring)
#   snakemake --cores all ceilings     one topic's figure for this machine, measuring what is missing
#   snakemake --report report.html figures   an HTML report of every figure with its caption
#
# Scale and machine: --config scale=tiny|cpu|h200 machine=NAME (see config/config.yaml).

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
# One rules file per topic: each registers its parts and defines its target rule.
include: "workflow/rules/ceilings.smk"
include: "workflow/rules/feature_gather.smk"
include: "workflow/rules/gnn_training.smk"
include: "workflow/rules/gnn_multi_gpu.smk"
# The measuring and rendering jobs shared by every registered topic.
include: "workflow/rules/measure_and_render.smk"


rule reproduce:
    """Measure every topic on this machine at the configured scale and render its figures."""
    input:
        [topic_targets(name) for name in TOPICS],


rule figures:
    """Render every figure from the results already in results/ (no measuring)."""
    input:
        [committed_figures(name) for name in TOPICS],
