"""The lightning indexer's kernels (logits, then the top-k the decode attends to), in the campaign's order;
importing a module registers its impls with dsv4lab.registry."""
from . import reference  # noqa: F401  (the float64 judge)
from . import fallback  # noqa: F401  (S0-S3: SGLang's torch fallback over the max context)
from . import triton_indexer  # noqa: F401  (S4: the Triton indexer over the live context, and its top-k)
