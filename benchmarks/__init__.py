"""lit-liger benchmarks: ``python -m benchmarks kernels|step|all|plot`` (see benchmarks/README.md)."""
