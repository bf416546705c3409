"""The techniques under study and their baselines, one subpackage each, each with its CUDA kernels."""
