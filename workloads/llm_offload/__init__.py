"""SSDTrain activation offloading against keeping, recomputing, ``save_on_cpu`` and other libraries'
offloading. The policies and stores compared are the registries of systems/ssdtrain (``POLICIES``,
``STORES``); a new one is a new file there, measured here without an edit (variants.py).

One part, ``policies``: for each model of the scale (GPT-2 and Llama shapes from workloads.llm),
one seeded training step per policy is first checked bit-identical to ``keep`` (losses and every
gradient), then timed, then checked again from the same weights (its rows are written only
then); each row says how much activation memory the step held on the device and what the store
moved. Without a GPU it runs the same policies and stores on the CPU (KvikioStore
and pinned memory are GPU-only; the provenance notes say what was skipped and why).

A second part, ``models``, runs the same policies on more models (the other families, a deeper
configuration), usually with fewer stores: the main comparison per model.

A third part, ``micro_batches``: the memory offloading frees, spent on a larger micro-batch at a
fixed global batch (gradient accumulation): tokens per second and activation bytes of keep,
recompute and offload_all per micro-batch, an out-of-memory recorded as an outcome.

A fourth, ``memory_bound``: under a cap on device memory, each policy's largest micro-batch that
fits (a search that records each micro-batch that does not) and its tokens per second at every
micro-batch up to it, at a fixed global batch: the throughput the freed memory buys, each policy at
its fastest, over keep at keep's.

A fifth, ``shapes`` (GPU only): the policies at the paper's three (hidden, layers) shapes and its
micro-batch 16. A sixth, ``convergence``: a small model trained for many steps on the generated
Markov language under keep, recompute and offloading, every step's loss checked bit-identical.
A seventh, ``frontier_models`` (GPU only): on model families of other shapes (Mistral, Qwen2),
the planner on compiled blocks at several budgets against torch's own activation memory budget:
the two frontiers of step time against activation peak. An eighth, ``compiled_models`` (GPU
only): the same on the other families at the headline shape (GPT-2, BERT, T5), so that part
``models``' comparison has torch's frontier beside the suite's policies (a part of its own: the
compiles do not fit in ``models``' run).
"""

from harness.topic import Part, Topic
from workloads.llm_offload.schema import SCHEMA

TOPIC = Topic(
    name="llm_offload",
    title="LLM activation offloading (SSDTrain)",
    technique="ssdtrain",
    schema=SCHEMA,
    parts=(
        Part("policies", gpus=1, cpu=True),
        Part("models", gpus=1, cpu=True),
        Part("micro_batches", gpus=1, cpu=True),
        # The largest micro-batch under a memory cap: the allocator's on a GPU, a byte limit on a CPU.
        Part("memory_bound", gpus=1, cpu=True),
        Part("shapes", gpus=1, cpu=False),  # the paper's full-size shapes: a GPU's work
        Part("convergence", gpus=1, cpu=True),
        Part("frontier_models", gpus=1, cpu=False),  # compiled blocks at several budgets: minutes of inductor a model
        Part("compiled_models", gpus=1, cpu=False),  # the same on part models' families
    ),
    packages=("transformers",),
)
