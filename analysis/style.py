"""One look for every figure of the suite: a fixed colour and line style per variant, so a path
reads the same in every panel and every topic's figure."""

import zlib

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


# A variant this module has never seen (a user's new entry) still gets a colour, the same one in
# every figure and every run: picked from these by a checksum of its name (not Python's hash(),
# which changes per process), drawn dash-dotted so it reads as "not one of the suite's own".
UNSEEN_PALETTE = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4",
    "#b2df8a", "#fb9a99", "#cab2d6", "#6a3d9a",
]  # fmt: skip


def style(variant: str) -> tuple[str, str]:
    """(colour, line style) of ``variant``; stable for variants not listed above."""
    if variant in VARIANT_STYLE:
        return VARIANT_STYLE[variant]
    return UNSEEN_PALETTE[zlib.crc32(variant.encode()) % len(UNSEEN_PALETTE)], "-."


def color(variant: str) -> str:
    return style(variant)[0]
