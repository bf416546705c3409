# Reproduction workflow of the data-efficient training suite.
#
#   snakemake --cores all reproduce    measure on this machine at config's scale, then render its figures
#   snakemake --cores all figures      re-render every figure from the results in results/ (no measuring)
#   snakemake --cores all ceilings     one topic's figure for this machine, measuring what is missing
#   snakemake --report report.html figures   an HTML report of every figure with its caption
#   snakemake --cores 1 doc_tables     rewrite the measured tables of docs/ from results/
#
# Scale and machine: --config scale=tiny|cpu|h200 machine=NAME (see config/config.yaml).
# The topics are found under workloads/ (harness/topic.py); each gets a target rule of its name.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# Validated config, the machine and scale this run measures, the topics and their input functions.
include: "workflow/rules/common.smk"
# Per topic: measure one part, render one machine's figure, and the topic's target rule.
include: "workflow/rules/topics.smk"
# The papers' headline claims against each machine's results, and the `claims` target.
include: "workflow/rules/claims.smk"
# Supporting figures beside each figure, with their captions, and the docs' generated tables.
include: "workflow/rules/supporting.smk"
include: "workflow/rules/report.smk"


rule reproduce:
    """Measure every topic on this machine at the configured scale and render its figures."""
    default_target: True
    input:
        measuring_targets(*TOPICS, claims=True),


rule figures:
    """Render every figure from the results already in results/ (no measuring)."""
    input:
        figures_inputs,


onerror:
    # `log`: the paths of this run's log files
    outdate_restored_outputs(log)
