"""Transformer language models for the activation-offloading measurements (SSDTrain); not a topic.

``models`` builds GPT-2, BERT, T5 and Llama from Hugging Face configs with seeded random weights
(no downloads), at the paper's shapes or tiny ones for tests; ``layers`` finds each model's
repeated transformer blocks, the modules an offloader or recomputation wraps; ``data`` makes
seeded batches (uniform random tokens, or a small Markov-chain language a model can learn);
``cost`` has the analytic per-layer FLOPs, saved-activation bytes and the write bandwidth that
hides a layer's offload in its own forward; ``profile`` measures the same quantities on a real
model, for the planner and for checking the formulas. Topics import from here, never from each
other. Importing this package is cheap: transformers loads only when a model is built.
"""
