# The jobs of every topic: measure one part on this machine; render one machine's figure; and
# the topic's own target rule (`snakemake --cores all <topic>`).


rule measure:
    """Measure one part of a topic on this machine."""
    output:
        csv="results/{machine}/{topic}/{part}-{scale}.csv",
        provenance="results/{machine}/{topic}/{part}-{scale}.provenance.json",
    log:
        "logs/{machine}/{topic}/{part}-{scale}.log",
    wildcard_constraints:
        # Only this machine's results are ever measured; other machines' are committed files.
        machine=re.escape(MACHINE),
        topic="|".join(TOPICS),
        part="[a-z0-9_]+",
    # Measurements never overlap, nor share the machine with rendering: each takes every core
    # (which holds even when --resources on the command line replaces the profile's limits),
    # the one timing slot, and the GPUs the part holds (harness/topic.py: Part.gpus).
    threads: workflow.cores
    resources:
        timing_slot=1,
        gpu=lambda wildcards: TOPICS[wildcards.topic].part(wildcards.part).gpus_held(GPU_COUNT),
    params:
        python=PYTHON,
        config_file=CONFIG_FILE,
        scratch_dir=config["scratch_dir"],
    shell:
        "{params.python} -m workloads {wildcards.topic} --part {wildcards.part} --scale {wildcards.scale}"
        " --out {output.csv} --config {params.config_file} --scratch-dir {params.scratch_dir} --whole-or-nothing"
        " 2>&1 | tee {log}"


for topic in TOPICS.values():

    rule:
        name:
            topic.name
        input:
            measuring_targets(topic.name),

    # A render writes to temporary files and replaces the figure only when it succeeds, and
    # `update` keeps Snakemake from deleting the previous figure before the job and restores
    # it after a failed one: a failed render never loses a committed figure.
    rule:
        name:
            f"{topic.name}_figure"
        input:
            unpack(figure_inputs(topic.name)),
            notebook=topic.notebook,
            helpers=["analysis/common.py", "analysis/style.py"],
        output:
            figure=report(
                update(f"paper_figs/{{machine}}/{topic.name}-{{scale}}.png"),
                caption=f"../../{topic.caption}",
                category=topic.title,
                labels={"machine": "{machine}", "scale": "{scale}"},
            ),
            summary=update(f"paper_figs/{{machine}}/{topic.name}-{{scale}}.md"),
        log:
            notebook=f"logs/{{machine}}/notebooks/{topic.name}-{{scale}}.ipynb",
        params:
            python=PYTHON,
            results=results_arguments(topic.name),
        shell:
            "{params.python} -m analysis.render {input.notebook} --executed {log.notebook}"
            " -p machine={wildcards.machine} -p scale={wildcards.scale} {params.results}"
            " --figure {output.figure} --summary {output.summary}"
