"""How often the indexer's top-k misses the float64 reference's selection, and what a miss costs
the attention that follows: SGLang's bf16 fallback (impl "torch_bf16") and the Triton path.

    python experiments/indexer_selection_quality/quality.py OUT.json [--full] [--cpu-smoke]

For each key structure and draw: B requests with ``live`` tokens each, H = 64 indexer heads,
top-512 (the model's). The selection of each impl is compared with the float64 reference's
(``testing.topk_recall``, exact ties counted as found). Then the sparse decode
(``reference.sparse_decode``: ``dsv4lab.sparse_decode(impl="reference")`` before its output is
rounded to bf16, whose 2^-9 steps would hide the differences) runs on each selection over a main KV cache
whose attention logit for token t is the indexer's standardized float64 logit plus noise (the
indexer exists to predict which tokens the attention weighs), and its output is compared with the
decode over the reference selection (``testing.rel_err``), beside one yardstick: the same decode
with the reference's k-th token swapped for its (k+1)-th (one boundary swap).

Key structures: "iid" (the lab's random keys), "clustered" (64 centres + 2% noise: tokens of one
centre score nearly alike, so the threshold cuts through near-ties), "low_rank" (rank-8 keys +
5% noise: smooth, correlated scores), "repeats" (a quarter of the tokens copies of others, as
repeated text: exact ties).

Default: B = 8, 2048 live tokens, 12 draws a structure (CPU, Triton's interpreter: a few minutes).
``--full``: B = 32, 8192 live, 25 draws (a GPU: ~5 minutes, most of it on the host). ``--cpu-smoke``: one tiny draw.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import numpy as np
import torch

from dsv4lab import api, reference
from dsv4lab.cache import pack_index_k, pack_kv
from dsv4lab.testing import make_indexer_inputs, rel_err, topk_recall
from dsv4lab import registry
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "indexer_selection_quality"
K = 512
H_INDEX = 64
H_ATTN = 4            # attention heads of the decode: each sees the same selection
IMPLS = ["torch_bf16", "triton"]
STRUCTURES = ["iid", "clustered", "low_rank", "repeats"]


def logical_keys(kind, B, live, g):
    """[B, live, 128] indexer keys with the structure ``kind``."""
    if kind == "iid":
        return torch.randn(B, live, 128, generator=g)
    if kind == "clustered":
        centres = torch.randn(B, 64, 128, generator=g)
        pick = torch.randint(0, 64, (B, live), generator=g)
        return centres.gather(1, pick[..., None].expand(B, live, 128)) + 0.02 * torch.randn(B, live, 128, generator=g)
    if kind == "low_rank":
        return torch.randn(B, live, 8, generator=g) @ torch.randn(B, 8, 128, generator=g) / 8 ** 0.5 \
            + 0.05 * torch.randn(B, live, 128, generator=g)
    if kind == "repeats":
        k = torch.randn(B, live, 128, generator=g)
        src = torch.randint(0, live, (B, live), generator=g)
        copy = torch.rand(B, live, generator=g) < 0.25
        return torch.where(copy[..., None], k.gather(1, src[..., None].expand(B, live, 128)), k)
    raise ValueError(kind)


def structured_inputs(kind, B, live, seed):
    """make_indexer_inputs' page table, q and weights, with keys of the structure ``kind`` written
    where the page table puts each token."""
    inp = make_indexer_inputs(B, H_INDEX, live, seq_lens=live, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    keys = logical_keys(kind, B, live, g)
    t = torch.arange(live)
    phys = inp.page_table.cpu().long()[:, t // 64] * 64 + t % 64                 # [B, live] physical tokens
    flat = torch.zeros(inp.cache.num_pages * 64, 128)
    flat[phys.reshape(-1)] = keys.reshape(-1, 128)
    inp.cache = pack_index_k(flat.to(inp.q.device))
    return inp


def decode_inputs(ref_logits, live, g, device):
    """A main KV cache and q where token t of request b (cache row b * live + t) has the attention
    logit (standardized indexer logit of t) + N(0, 0.1^2): kv_t = z_t * u + noise (v = k in MLA)."""
    B = ref_logits.shape[0]
    z = ref_logits.double().cpu()
    z = (z - z.mean(1, keepdim=True)) / z.std(1, keepdim=True)
    u = torch.randn(512, generator=g, dtype=torch.float64)
    u /= u.norm()
    kv = z[..., None] * u + 0.1 * torch.randn(B, live, 512, generator=g, dtype=torch.float64)
    q = (u * 512 ** 0.5).expand(B, H_ATTN, 512)               # q . kv_t / sqrt(512) = z_t + noise
    return pack_kv(kv.reshape(B * live, 512).float().to(device)), q.to(torch.bfloat16).to(device)


def decode(cache, q, positions, live):
    ids = torch.where(positions >= 0, positions + torch.arange(positions.shape[0], device=positions.device)[:, None]
                      * live, -1).int()
    out, _ = reference.sparse_decode(q, cache, ids)        # impl="reference" without its final bf16 rounding
    return out


def one_swap(ref_sel, ref_logits):
    """The reference selection with its lowest-logit token swapped for the best one it left out."""
    sel = ref_sel.clone()
    for b in range(sel.shape[0]):
        chosen = sel[b][sel[b] >= 0].long()
        if len(chosen) == 0 or len(chosen) >= ref_logits.shape[1]:
            continue
        x = ref_logits[b].double()
        worst = chosen[x[chosen].argmin()]
        rest = torch.ones_like(x, dtype=torch.bool)
        rest[chosen] = False
        best_out = torch.nonzero(rest).flatten()[x[rest].argmax()]
        sel[b][sel[b] == worst] = best_out.int()
    return sel


def draw(kind, B, live, seed):
    inp = structured_inputs(kind, B, live, seed)
    args = (*inp.args(),)
    ref_logits = reference.indexer_logits(*args, live)
    ref_sel = reference.topk_indices(ref_logits, K)
    kth = ref_logits.double().topk(min(K, live), dim=1).values[:, -1]
    g = torch.Generator().manual_seed(seed + 2)
    cache, q = decode_inputs(ref_logits, live, g, inp.q.device)
    out_ref = decode(cache, q, ref_sel, live)
    swap = decode(cache, q, one_swap(ref_sel, ref_logits), live)
    rows = []
    sels = {impl: registry.impl_info("indexer_topk", impl).fn(*args, max_seq_len=live, topk=K) for impl in IMPLS}
    outs = {impl: decode(cache, q, s, live) for impl, s in sels.items()}
    for b in range(B):
        x = ref_logits[b].double()
        near = int(((x - kth[b]).abs() <= 1e-3 * x.abs().max()).sum())
        row = dict(structure=kind, seed=seed, b=b, live=live, near_ties=near,
                   one_swap_out_err=rel_err(swap[b], out_ref[b]))
        for impl in IMPLS:
            row[f"recall_{impl}"] = topk_recall(sels[impl][b:b + 1].cpu(), ref_sel[b:b + 1].cpu(), ref_logits[b:b + 1].cpu())
            row[f"out_err_{impl}"] = rel_err(outs[impl][b], out_ref[b])
        rows.append(row)
    return rows


def summary(rows):
    """Per structure and impl: the distribution of recall and of the decode's output error."""
    out = []
    for kind in STRUCTURES:
        rs = [r for r in rows if r["structure"] == kind]
        if not rs:
            continue
        for impl in IMPLS + ["one_swap"]:
            row = dict(kind="summary", structure=kind, impl=impl, rows=len(rs))
            if impl != "one_swap":
                rec = np.array([r[f"recall_{impl}"] for r in rs])
                row.update(recall_min=float(rec.min()), recall_p5=float(np.percentile(rec, 5)),
                           recall_median=float(np.median(rec)), recall_mean=float(rec.mean()),
                           rows_with_a_miss=int((rec < 1).sum()))
            err = np.array([r[f"out_err_{impl}" if impl != "one_swap" else "one_swap_out_err"] for r in rs])
            row.update(out_err_median=float(np.median(err)), out_err_p95=float(np.percentile(err, 95)),
                       out_err_max=float(err.max()))
            out.append(row)
    return out


def main(argv=None):
    def add(p):
        p.add_argument("--full", action="store_true", help="B=32, 8192 live, 25 draws a structure (for a GPU)")
    a = ab.parse_args(__doc__, add, argv)
    if a.cpu_smoke:
        B, live, draws = 2, 600, 1
    elif a.full:
        B, live, draws = 32, 8192, 25
    else:
        B, live, draws = 8, 2048, 12
    rows = []
    for kind in STRUCTURES:
        for i in range(draws):
            rows += [dict(kind="draw", **r) for r in draw(kind, B, live, seed=1000 * STRUCTURES.index(kind) + i)]
        ab.write(a.out, QUESTION, a.cpu_smoke, B=B, live=live, topk=K, draws=draws, rows=rows,
                 summary=summary(rows), complete=False)
    ab.write(a.out, QUESTION, a.cpu_smoke, B=B, live=live, topk=K, draws=draws, rows=rows, summary=summary(rows),
             complete=True)
    for s in summary(rows):
        print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in s.items()})


if __name__ == "__main__":
    main()
