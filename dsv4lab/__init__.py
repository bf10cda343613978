"""dsv4lab: replay the DeepSeek-V4-Flash decode kernel campaign, step by step.

Importing this package first decides the mode (CUDA GPU or Triton's CPU
interpreter) and sets TRITON_INTERPRET before anything imports triton; then it
loads the kernels, which registers every implementation (dsv4lab.registry).
docs/ARCHITECTURE.md draws the layers.
"""
from .device import exit_on_mode_error as _configure

_configure()

from . import cache, config, device, reference  # noqa: E402
from .api import indexer_logits, indexer_topk, sparse_decode  # noqa: E402
from .kernels import decode as _decode, error_word as _error_word, indexer as _indexer  # noqa: E402,F401  (registers)
from .config import DSV4_FLASH, shapes  # noqa: E402
from .errors import check_errors  # noqa: E402
from .merged_decode import flash_mla_sparse_decode  # noqa: E402
from .registry import impls  # noqa: E402

__all__ = ["cache", "config", "device", "reference", "impls", "sparse_decode",
           "indexer_logits", "indexer_topk", "flash_mla_sparse_decode", "check_errors", "DSV4_FLASH",
           "shapes"]
__version__ = "0.1.0"
