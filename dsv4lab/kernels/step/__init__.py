"""The decode step's own kernels (dsv4lab.model uses them; the lab's decode and indexer kernels are in
kernels/decode/ and kernels/indexer/): the mHC Sinkhorn normalization (``mhc``) and the MoE stand-in's
grouped GEMM (``moe``), with their float64 ``reference``."""
