"""impl "reference" of the indexer's two ops: the float64 judge (dsv4lab.reference), registered beside the
kernels it judges (the registry puts the indexer's device-side guard in front of it, as of every impl)."""
from __future__ import annotations

from ... import reference
from ...registry import register
from ..guards import flag_nonfinite_logits


@register("indexer_logits", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def indexer_logits_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)


@register("indexer_topk", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def indexer_topk_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    logits = reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    flag_nonfinite_logits(logits, seq_lens)
    return reference.topk_indices(logits, topk)
