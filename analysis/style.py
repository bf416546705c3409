"""One look for every figure of the suite: a fixed colour and line style per variant, so a path
reads the same in every panel and every topic's figure."""

# variant -> (colour, line style). Baselines in greys and black, stock torch on the alias in
# pinks, the suite's zero-copy steps in a warm-to-cool ramp, upper bounds in purple.
VARIANT_STYLE = {
    "pageable": ("tab:gray", ":"),
    "cpu_gather": ("black", "-"),
    "cpu_gather_pipelined": ("dimgray", "-."),
    "torch_uva": ("tab:pink", "-"),
    "torch_uva_sorted": ("mediumvioletred", "--"),
    "wholegraph": ("goldenrod", "-"),
    "all_in_gpu": ("tab:purple", "--"),
    "naive": ("tab:red", "-"),
    "aligned": ("tab:orange", "-"),
    "vectorized": ("tab:blue", "-"),
    "vectorized_kernel": ("tab:brown", ":"),
    "sorted": ("tab:green", "-"),
    "hot_cache": ("tab:olive", "-"),
    "split": ("tab:cyan", "-"),
    "default": ("teal", "-"),  # UnifiedTensor[idx]: the measured dispatch of the paths above
}


# LLM activation offloading (llm_offload): one colour per policy and store; emulated stores take
# a blue ramp by bandwidth, slowest lightest (EMULATED_RAMP, in the order of their bandwidths).
VARIANT_STYLE.update(
    {
        "keep": ("black", "-"),
        "recompute": ("tab:red", "-"),
        "save_on_cpu": ("tab:pink", "-"),
        "offload_all_host": ("tab:purple", "-"),
        "offload_all_file": ("tab:green", "-"),
        "offload_all_kvikio": ("tab:olive", "-"),
        "torchtune_offload": ("tab:brown", "-"),  # a peer: torchtune's OffloadActivations
        "deepspeed_offload": ("tab:orange", "-"),  # a peer: DeepSpeed's checkpointing, inputs on the host
    }
)
# Relational GNN layers (relational_gnn): the baseline forms of workloads/rgnn.
VARIANT_STYLE.update(
    {
        "pyg": ("tab:orange", "-"),
        "pyg_fast": ("tab:brown", "-"),
        "per_edge": ("tab:red", "-"),
        "segment_mm": ("tab:blue", "-"),
        "grouped_mm": ("tab:green", "-"),
        # Hector's generated layers (systems/hector), light to dark by how much of it is on.
        "hector_unopt": ("thistle", "-"),
        "hector_compact": ("orchid", "-"),
        "hector_reorder": ("mediumpurple", "-"),
        "hector_best": ("indigo", "-"),
        "hector_best_tf32": ("deeppink", "--"),  # tensor cores: a labelled, less exact variant
    }
)
EMULATED_RAMP = ["lightskyblue", "deepskyblue", "tab:blue", "mediumblue", "midnightblue"]


def color(variant: str) -> str:
    return VARIANT_STYLE[variant][0]
