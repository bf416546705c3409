# The two jobs of every topic: measure one part on this machine; render one machine's figure.


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
    # the one timing slot, and the GPUs it uses (one on a GPU machine; a multi-GPU part its count).
    threads: workflow.cores
    resources:
        timing_slot=1,
        gpu=lambda wildcards: TOPICS[wildcards.topic].gpus(wildcards.part),
    params:
        python=PYTHON,
        config_file=CONFIG_FILE,
        scratch_dir=config["scratch_dir"],
    shell:
        "{params.python} -m workloads.{wildcards.topic} --part {wildcards.part} --scale {wildcards.scale}"
        " --out {output.csv} --config {params.config_file} --scratch-dir {params.scratch_dir}"
        " 2>&1 | tee {log}"


for topic in TOPICS.values():

    rule:
        name:
            f"{topic.name}_figure"
        input:
            topic_results(topic.name),
            notebook=f"analysis/{topic.name}.py",
            helpers="analysis/common.py",
        output:
            figure=report(
                f"paper_figs/{{machine}}/{topic.name}-{{scale}}.png",
                caption=f"../report/{topic.name}.rst",
                category=topic.title,
                labels={"machine": "{machine}", "scale": "{scale}"},
            ),
            summary=f"paper_figs/{{machine}}/{topic.name}-{{scale}}.md",
        log:
            notebook=f"logs/{{machine}}/notebooks/{topic.name}-{{scale}}.ipynb",
        params:
            python=PYTHON,
        shell:
            "{params.python} -m analysis.render {input.notebook} --executed {log.notebook}"
            " -p machine={wildcards.machine} -p scale={wildcards.scale}"
            " -p figure={output.figure} -p summary={output.summary}"
