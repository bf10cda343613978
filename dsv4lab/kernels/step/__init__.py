"""The decode step's own kernels (dsv4lab.model and dsv4lab.step_fused use them; the lab's decode and indexer
kernels are in kernels/decode/ and kernels/indexer/), with their float64 ``reference``:

* S0-S4: the mHC Sinkhorn normalization (``mhc``) and the MoE stand-in's grouped GEMM (``moe``);
* S5, the glue fused (one module per fused op): ``mhc_fused`` (the mHC pre and post), ``attn_input``
  (the input projection's epilogue: q LoRA norm, the new token's cache bytes, the state rings),
  ``norm_rope`` (RMS norm and rope of many rows), ``decode_epilogue`` (merge, sink, inverse rope),
  ``router``, ``moe_fused`` (the experts' GEMMs with their gather, SiLU and weights, the sum),
  ``cache_ids`` (top-k positions to cache token ids), and ``rounding`` (bf16 / fp8 rounding to nearest
  even that the interpreter does not do)."""
