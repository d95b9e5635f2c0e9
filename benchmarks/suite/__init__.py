"""The benchmarks themselves, one module each; every module here is imported and registers by name."""
