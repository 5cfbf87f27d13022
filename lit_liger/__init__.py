"""lit-liger: faster, leaner LitGPT training on GPUs with Triton kernels."""

__version__ = "0.1.0"
