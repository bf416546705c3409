"""Results format of the relational_gnn topic (see harness.results for the common columns).

``dataset`` names the graph (``nations``, ``aifb-like``, ``am-like-0.01`` at a scale factor);
``variant`` is the form's entry name in the registry systems/rgnn/forms, ``role`` its role there:
``peer`` (PyG's layers: ``pyg``, ``pyg_fast``; the dense form, ``dense``; torch.compile of forms:
``dense_compiled``, ``grouped_mm_compiled``, ``per_edge_compiled``, ``pyg_compiled``),
``baseline`` (the plain forms: ``per_edge``, ``segment_mm``, ``grouped_mm``) or ``optimized``
(Hector: ``hector_unopt``, ``hector_compact``, ``hector_reorder``, ``hector_best``,
``hector_best_tf32``). ``form`` is what the variant computes
whatever its precision (``hector_best_tf32``'s is ``hector_best``), ``precision`` its products'
precision (``float32``: TF32 off; ``tf32``: tensor cores, TF32 inputs and fp32 accumulate;
``bfloat16``), ``dtype`` the element type of its tensors. Part ``gemm_template``'s rows have
``model`` = ``gemm``: the GEMM template (``hector_gemm``) against ``grouped_mm``, ``segment_mm``
and ``cublas`` on equal segment shapes (``edges`` rows in ``relations`` segments). Metrics per
timed call: ``time``, ``cpu_time``, on a GPU ``peak_gpu_memory`` and ``intermediate_memory`` (the
peak allocated during the call minus what was allocated before the timed loop: the graph, the
features, the weights and, for training, their gradients and optimizer state). Where a form did
not fit: ``out_of_memory`` (1), ``failed_allocation_bytes`` (the size of the allocation that
failed), ``process_memory_at_failure_bytes`` and ``allocated_at_failure_bytes`` (what the process
held then, in all and in torch's tensors), each from the error, absent if it did not say.
``breakdown_time``: one profiled call's time per ``kernel_class`` (on a GPU every kernel's device
time, under the operator that launched it; CPU time on a CPU);
``breakdown_bytes``: the same call's bytes allocated per ``kernel_class`` (device memory on a GPU,
host memory on a CPU; allocation volume, not the peak). Per form and mode, once:
``first_call_time``, the form's first call in that mode (a compiled form's compile time; never
part of ``time``), and for the compiled forms ``graph_breaks``, those dynamo met compiling it.
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="relational_gnn",
    config={
        "device": str,  # "cuda" or "cpu"
        "model": str,  # "rgcn", "rgat" or "hgt"
        "mode": str,  # "inference" (forward, no gradients), "training" (forward, backward, step) or
        # "training_graphed" (that step captured as one CUDA graph and replayed)
        "in_dim": int,
        "out_dim": int,
        "form": str,  # what the variant computes, whatever its precision (a form's name)
        "precision": str,  # of the products: "float32" (TF32 off), "tf32" (tensor cores: TF32 inputs,
        # fp32 accumulate) or "bfloat16" (gemm_template only: bf16 inputs and results)
        "dtype": str,  # the element type of the features, weights and results: "float32" or "bfloat16"
        "nodes": int,
        "edges": int,
        "relations": int,
        "unique_pairs": int,  # distinct (source, relation) pairs: what compact materialization computes
        "scale_factor": float,  # share of the dataset's published nodes and edges (1 for the real graphs)
        "memory_cap_bytes": int,  # the GPU memory the run allowed itself, where capped
        "kernel_class": str,  # breakdown_*: gemm, aggregation, gather_scatter, elementwise, other
    },
    metrics={
        "intermediate_memory": "B",
        "out_of_memory": "1",
        "failed_allocation_bytes": "B",
        "process_memory_at_failure_bytes": "B",  # all the process held when the allocation failed
        "allocated_at_failure_bytes": "B",  # torch's tensors alone, then
        "breakdown_time": "s",  # one profiled call's time in one kernel_class (systems/rgnn/breakdown.py)
        "breakdown_bytes": "B",  # the same call's bytes allocated in one kernel_class
        "first_call_time": "s",  # the form's first call in the mode, device drained (compiled: compiles)
        "graph_breaks": "1",  # compiled forms: graph breaks dynamo met compiling for the mode
    },
)
