"""Results format of the llm_offload topic (see harness.results for the common columns).

``dataset`` names the model (``gpt2-tiny``, ``llama-paper-8192x4``). Each row says what ran in
columns of its own: ``policy`` (a name of systems.ssdtrain.POLICIES), ``store`` (a name of
systems.ssdtrain.STORES, empty for a policy that offloads nothing) and the store's setting
(``emulated_gbps``); ``variant`` is a readable label composed of them in one place
(workloads/llm_offload/variants.py: ``offload_all_emulated_4gbps``), never parsed back. ``role``
is the policy's entry's: ``keep``, ``recompute`` and ``save_on_cpu`` are ``baseline``; the peers
(``torchtune_offload``: torchtune's ``OffloadActivations``; ``deepspeed_offload``: DeepSpeed's
activation checkpointing with ``checkpoint_in_cpu``; each on a GPU where it imports) ``peer``; the
offloading policies ``optimized``. Part ``convergence`` records ``loss`` per optimizer step
(``repetition`` = the step).

Metrics per timed step: ``time`` and ``cpu_time``; ``flop_rate``, the model TFLOP/s
(workloads.llm.cost.training_flops: recomputation's extra forward is not counted); on a GPU
``peak_gpu_memory`` (the step's peak allocated memory, optimizer step included) and
``activation_peak`` (the peak of forward and backward, read before the optimizer step, minus what
was allocated before the step: weights, gradients, which the timed steps zero instead of freeing,
and optimizer state). From the saved-tensor hooks of every policy: ``activation_bytes``, the saved
activations held on the compute device for backward (unique storages, parameters excluded; an
offloaded tensor counts as gone once it is handed to the store, even while its write is still
running, so on a GPU the peak is the measure of memory; for ``recompute`` the tensors saved outside
the checkpointed blocks plus the blocks' inputs that checkpointing holds; for ``save_on_cpu`` zero
on a GPU, as it copies every saved tensor to the host, and on a CPU what keep holds, as
``tensor.cpu()`` is then the tensor itself); ``bytes_packed`` (every save, counted each time) and
``bytes_unique`` (each storage once). From the store: ``write_seconds`` and ``read_seconds`` (wall
time with a transfer of that direction in flight: bytes over them is the bandwidth achieved),
``bytes_written`` and ``bytes_read`` (the tensors' own bytes; ``save_on_cpu``'s copies to and from
the host on a GPU count as written and read, every save again, parameters included; on a CPU it
moves nothing). The planned policies (``offload_adaptive``: SSDTrain's rule; ``planner``: keep,
offload or recompute per layer within a budget) record their plan's predictions as the metrics
``predicted_time``, ``predicted_activation_bytes`` and, on a GPU, ``predicted_activation_peak``
(repetition 0), beside the measured ones.
``offload_all`` records ``bound_activation_bytes`` (repetition 0): the largest activation-peak
reduction its store's measured bandwidth allows at no time overhead (systems/ssdtrain/bound.py),
beside the reduction it measured. The provenance record's notes hold, per model, the bound's
terms (``bounds``; ``bounds_compiled`` for the policies on compiled blocks), the profile and plans
of the planned policies, and ``optimizer_seconds`` per variant: the AdamW step, timed apart, which a
plan's predicted time leaves out.
Part ``memory_bound`` records, per policy, ``fits`` for each micro-batch its search tried under
the cap ``memory_cap_gib``, and at the largest that fit the timed steps (``time`` per optimizer
step of ``global_batch`` sequences) and ``tokens_per_second``.

The policies on blocks compiled by ``torch.compile`` (``compiled`` true; where a part's
parameters set ``compiled``): ``compiled_keep`` (peer; the reference of the compiled ones, as
``keep`` is of the eager ones), ``torch_budget`` (peer; ``activation_budget`` says under which
budget, the variant ``torch_budget_0.5``), ``offload_all_compiled`` (optimized, with each store) and
``planned_compiled`` (optimized: the planner on a profile of the compiled blocks).
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="llm_offload",
    config={
        "device": str,  # where the model trains: "cuda" or "cpu"
        "family": str,  # gpt2, llama (workloads.llm.models.FAMILIES)
        "preset": str,  # workloads.llm.models.PRESETS name the shape started from
        "hidden": int,
        "layers": int,
        "sequence": int,
        "micro_batch": int,
        "global_batch": int,  # micro_batches, memory_bound: sequences per optimizer step (gradient accumulation)
        "memory_cap_gib": float,  # memory_bound: the cap on device memory (GiB) the micro-batch had to fit under
        "dtype": str,  # "bfloat16" on a GPU, "float32" on a CPU
        "policy": str,  # a name of systems.ssdtrain.POLICIES: keep, recompute, offload_all, ...
        "store": str,  # a name of systems.ssdtrain.STORES (host, file, kvikio, emulated); empty: no store
        "store_emulated": bool,  # the store's bandwidth is emulated (EmulatedStore), not a device's
        "emulated_gbps": float,  # the emulated bandwidth, GB/s (10^9 B/s); empty when not emulated
        "keep_last": int,  # the offloading policies: the last layers kept on the device
        "min_bytes": int,  # the offloading policies: saved tensors smaller than this are kept
        "layers_offloaded": int,  # offload_adaptive, planner: layers the plan offloads...
        "layers_recomputed": int,  # ...and recomputes (the rest are kept)
        "layers_budgeted": int,  # planned_compiled: ...and runs under an activation budget (some offloaded there too)
        "planned_gbps": float,  # the store bandwidth the plan was made for, measured just before (GB/s)
        "budget_fraction": float,  # planner: the activation budget, a fraction of what keep saves
        # planned_compiled: planned within the predicted peak and bytes of every block compiled at this
        # torch activation budget (frontier_matched), not within a fraction
        "matched_budget": float,
        "compiled": bool,  # the blocks ran compiled by torch.compile (reference: compiled_keep); empty: eager
        "activation_budget": float,  # torch_budget: torch._functorch.config.activation_memory_budget
    },
    metrics={
        "activation_bytes": "B",
        "activation_peak": "B",
        # GPU: the allocator's bytes above the step's start when forward returned (the loss and logits
        # included), beside activation_bytes, what the hooks count as kept then
        "allocated_at_forward_end": "B",
        "bytes_packed": "B",
        "bytes_unique": "B",
        "bytes_written": "B",
        "bytes_read": "B",
        "bytes_made_contiguous": "B",  # copied on the GPU before a write: the tensor was not contiguous
        "write_seconds": "s",  # wall time the store had a write in flight during the step
        "read_seconds": "s",  # ...a read
        "out_of_memory": "1",  # micro_batches, memory_bound: 1 where the micro-batch did not fit (under the cap)
        "fits": "1",  # memory_bound: 1 where the policy's steps ran under the cap at that micro-batch, 0 if not
        "tokens_per_second": "tokens/s",  # memory_bound: at the policy's largest micro-batch under the cap
        "predicted_time": "s",  # the plan's predicted step time (systems/ssdtrain/planning.py)
        "predicted_activation_bytes": "B",  # ...and activation bytes when forward ends
        "predicted_activation_peak": "B",  # ...and activation_peak (GPU: from the profile's traced peaks)
        "bound_activation_bytes": "B",  # offload_all: the most its store could free at no time overhead
    },
)
