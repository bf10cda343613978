"""Triton kernels, one module per campaign stage, and ``auto``, which picks among them. Importing
registers them with dsv4lab.api."""
from . import sglang_peer  # noqa: F401
from . import simt  # noqa: F401
from . import head_batched  # noqa: F401
from . import split_k  # noqa: F401
from . import indexer_gemm  # noqa: F401
from . import indexer  # noqa: F401
from . import hopper  # noqa: F401
from . import auto  # noqa: F401  (last: it dispatches to the others)
