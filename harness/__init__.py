"""KernelHarness: evaluate LLM-written GPU kernels against reference PyTorch models.

Importing this package loads no torch: the API, DB and CLI layers stand on it.
"""

__version__ = "0.1.0"
