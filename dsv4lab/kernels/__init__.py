"""The lab's Triton kernels, grouped by op (as flash-linear-attention's ``ops/<op>/``):

* ``decode/``: the sparse-MLA decode, one module per kernel (``simt``, ``sglang_peer``, ``head_batched``,
  ``split_k``, ``hopper``, and ``auto``, which picks among them), the float64 ``reference`` registered
  beside them, what they share (``kv_tiles``: reading a tile of tokens out of the cache) and their
  launch configuration (``planning``: tiles, the launch-time model, launch options);
* ``indexer/``: the lightning indexer (``fallback``: SGLang's torch path; ``triton_indexer``: the Triton
  indexer over the live pages and its step; ``topk``: the exact top-k) and its ``reference``;
* ``step/``: the decode step's own kernels (dsv4lab.model: the mHC Sinkhorn, the MoE stand-in's GEMM; S5's fused glue);
* shared by all: ``launch`` (launch_kernel), ``buffers`` (outputs, workspaces), ``rows`` (a row's
  length and the error word's bits), ``error_word`` (the word's GPU atomics) and ``guards`` (the ops'
  guards around every registered impl).

Each kernel module registers its impls with dsv4lab.registry when imported; ``decode/__init__.py`` and
``indexer/__init__.py`` import them (the package's face imports those two). Importing this package in
interpret mode serializes Triton's interpreter, whose state is global (dsv4lab.concurrency).
"""
from .. import concurrency
from ..device import is_interpret

if is_interpret():
    concurrency.serialize_interpreter()      # one launch at a time
