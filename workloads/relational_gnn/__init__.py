"""Relational GNN layers in the forms Hector is measured against.

One layer on the full graph (Hector's protocol: 64 in, 64 out, one head), each model of
systems/rgnn/models (RGCN, RGAT, HGT, CompGCN) in every form of systems/rgnn/forms that computes
it (PyG's layers, the plain-torch forms, the dense form, torch.compile of them, Hector's variants),
for inference (forward without gradients) and training (forward, backward and an optimizer step).
Every form's output is checked against the ``segment_mm`` form's before any is timed. Parts:

- ``knowledge_graphs`` and (GPU machines only) ``more_knowledge_graphs``: the real Nations,
  Kinships and UMLS graphs from the pykeen wheel (the second a job of its own for the graphs the
  config gives it);
- ``datasets``: heterographs shaped like Hector's eight datasets (workloads/graphs/relational.py),
  at the scale's size;
- ``large_datasets`` and (GPU machines only) ``largest_datasets``: the same for the large ones,
  each in a job of its own;
- ``width_sweep`` (GPU machines only): the same graphs as ``datasets`` at other widths;
- ``shapes`` and ``large_shapes`` (GPU machines only): generated heterographs of shapes the config
  names, none of them a dataset's (the larger ones in a job of their own);
- ``bfloat16_datasets`` (GPU machines only): the ``datasets`` graphs on bfloat16 features and
  weights, every form that computes in bfloat16;
- ``gemm_template`` (GPU machines only): Hector's GEMM template against stock torch on equal
  segment shapes.

Each row's ``role`` is its form's in the registry: PyG's layers, the dense and the compiled forms
``peer``, the plain forms ``baseline``, Hector's variants (systems/hector) ``optimized``. A form that runs out of GPU
memory is recorded as ``out_of_memory`` with the size of the allocation that failed, not as a
failure.
"""

from harness.topic import Part, Topic
from workloads.relational_gnn.schema import SCHEMA

TOPIC = Topic(
    name="relational_gnn",
    title="Relational GNN layers (Hector's baselines)",
    technique="hector",
    schema=SCHEMA,
    parts=(
        Part("knowledge_graphs", gpus=1, cpu=True),
        Part("more_knowledge_graphs", gpus=1, cpu=False),
        Part("datasets", gpus=1, cpu=True),
        Part("large_datasets", gpus=1, cpu=True),
        Part("largest_datasets", gpus=1, cpu=False),
        Part("width_sweep", gpus=1, cpu=False),
        Part("shapes", gpus=1, cpu=False),
        Part("large_shapes", gpus=1, cpu=False),
        Part("bfloat16_datasets", gpus=1, cpu=False),
        Part("gemm_template", gpus=1, cpu=False),
    ),
    packages=("torch_geometric",),
)
