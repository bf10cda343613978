"""SGLang's public DSv4 decode, ``flash_mla_sparse_decode_triton``, with and without
``dsv4lab.integrations.sglang.patch()`` on one GPU: correctness, then timings. One JSON.

    PYTHONPATH=. python experiments/sglang_patch/run.py OUT.json [--cpu-smoke]

``--cpu-smoke`` (and any run without a GPU): the checks only, at tiny shapes through Triton's
interpreter (no graph capture, no timings), so the script is exercised on a laptop or in CI.

Inputs (DeepSeek-V4-Flash decode shapes, seed = B): H 64 query heads, q bf16 [B, 1, 64, 512]; the
sliding-window cache in pages of 256 tokens, each request attending to 128 of its 256 tokens; the
compressed cache in pages of 64, each request attending to the top-512 of its 8192 live tokens;
full topk_length for both; an attention sink per head; softmax scale 512 ** -0.5. SGLang's function
runs its window and compressed decodes, its LSE merge and its sink; patched, the two decodes are
the lab's ``impl="auto"``.

Checks at each B (``checks`` rows): unpatched and patched against the float64 reference (out 5e-3,
lse 1e-3), patched against unpatched (out 6.7e-3, the story's bound between the tensor-core and
the SIMT kernel), a row with no valid token (out 0, lse = sink), and a CUDA graph of the patched
function captured, then replayed on new q (in place) against an eager call on that q (bitwise).

Timings at B = 1, 16, 32, 64 (``timings`` rows): do_bench medians (L2 flushed), eager and as a
replayed one-call CUDA graph (dsv4lab.bench.time_ms), unpatched and patched interleaved, best of
two passes; ``speedup`` = unpatched / patched in the same run. SGLang reaches this function only on
sm_120 with its Triton backend selected; on another GPU these figures time the function on its own.
The lab's plan per B and cache is recorded. Also the indexer (``indexer`` rows): SGLang's sm120
torch fallback (from the wheel) vs the lab's replacement at B 32, 8192 live compressed tokens, max
context 8192 and 65536: logits against each other, graph timings.

Every case is caught: a failure becomes a row with ``error``, and the JSON is written at the end
(and after each section). Expected runtime on an H200: about 1.5 minutes (mostly Triton compiling:
SGLang's autotuner tries 3 configs at each of 2 top-k widths, the lab compiles its launches for
4 batch sizes x 2 caches), well under 3 minutes.
"""
import sys
from pathlib import Path
import time
import traceback

import torch

from dsv4lab import bench
from dsv4lab.integrations import sglang as integration
from dsv4lab.kernels.decode import sglang_peer, split_k
from dsv4lab.kernels.indexer import fallback
from dsv4lab.testing import (INDEXER_BF16_TOL, LSE_TOL, OUT_TOL, VS_SIMT_TOL, make_indexer_inputs,
                             make_merged_decode_inputs, rel_err)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

SMOKE = "--cpu-smoke" in sys.argv or not torch.cuda.is_available()
if SMOKE:
    H, WINDOW_K, WINDOW_CONTEXT, TOPK, LIVE, BATCHES = 16, 16, 32, 24, 64, (1, 2)
else:
    H, WINDOW_K, WINDOW_CONTEXT, TOPK, LIVE, BATCHES = 64, 128, 256, 512, 8192, (1, 16, 32, 64)
SCALE = 512 ** -0.5
INDEXER_MAX_SEQ_LENS = (8192, 65536)
DEVICE = "cpu" if SMOKE else "cuda"


def inputs(B):
    inp = make_merged_decode_inputs(B, H, WINDOW_K, TOPK, window_context=WINDOW_CONTEXT, compressed_context=LIVE,
                                    sink=True, seed=B, device=DEVICE)
    inp.window.topk_len = torch.full((B,), WINDOW_K, dtype=torch.int32, device=DEVICE)
    inp.compressed.topk_len = torch.full((B,), TOPK, dtype=torch.int32, device=DEVICE)
    return inp


def _error():
    """The exception being handled, its last frames."""
    return traceback.format_exc()[-1200:]


def check(mod, B):
    inp = inputs(B)
    inp.compressed.topk_len[0] = 0          # row 0: no compressed token, and (B > 1) no window token
    if B > 1:
        inp.window.indices[0] = -1
    args = inp.sglang_args(SCALE)
    fn = mod.flash_mla_sparse_decode_triton
    ref = inp.reference(SCALE)
    out0, lse0 = fn(*args)
    with integration.patched():
        before = integration.calls().get("decode:lab", 0)
        out1, lse1 = fn(*args)
        routed = integration.calls().get("decode:lab", 0) - before
        if SMOKE:                                   # no CUDA graphs in the interpreter
            out_g = out_e = out1
            lse_g = lse_e = lse1
        else:
            g, (out_g, lse_g) = bench.capture(lambda: fn(*args))
            args[0].copy_(torch.randn_like(args[0], dtype=torch.float32).to(torch.bfloat16))
            g.replay()
            out_e, lse_e = fn(*args)
            torch.cuda.synchronize()
    sink = inp.window.attn_sink.float()
    row = dict(B=B, lab_calls_per_call=routed,
               unpatched_vs_ref_out=rel_err(out0[:, 0].float(), ref[0]), unpatched_vs_ref_lse=rel_err(lse0[..., 0], ref[1]),
               patched_vs_ref_out=rel_err(out1[:, 0].float(), ref[0]), patched_vs_ref_lse=rel_err(lse1[..., 0], ref[1]),
               patched_vs_unpatched_out=rel_err(out1.float(), out0.float()), patched_vs_unpatched_lse=rel_err(lse1, lse0),
               graph_replay_new_q_bitwise=bool(torch.equal(out_g, out_e) and torch.equal(lse_g, lse_e)),
               shapes_dtypes_match=bool(out1.shape == out0.shape and lse1.shape == lse0.shape
                                        and out1.dtype == out0.dtype and lse1.dtype == lse0.dtype))
    if B > 1:
        row["empty_row_ok"] = bool((out1[0] == 0).all() and torch.equal(lse1[0, :, 0], sink)
                                   and (out0[0] == 0).all() and torch.equal(lse0[0, :, 0], sink))
    row["ok"] = row["passed"] = bool(row["unpatched_vs_ref_out"] <= OUT_TOL and row["unpatched_vs_ref_lse"] <= LSE_TOL
                         and row["patched_vs_ref_out"] <= OUT_TOL and row["patched_vs_ref_lse"] <= LSE_TOL
                         and row["patched_vs_unpatched_out"] <= VS_SIMT_TOL and row["patched_vs_unpatched_lse"] <= LSE_TOL
                         and row["graph_replay_new_q_bitwise"] and row["shapes_dtypes_match"]
                         and row.get("empty_row_ok", True) and routed == 2)
    return row


def plans(B):
    out = {}
    for name, K in (("window", WINDOW_K), ("compressed", TOPK)):
        p = split_k.choose(B, H, K)
        out[name] = dict(K=K, use=p.use, nsplit=p.nsplit, block_h=p.cfg.block_h, block_n=p.cfg.block_n,
                         model_us=round(p.model_us, 2))
    return out


def timings(mod, B, passes=2):
    inp = inputs(B)
    args = inp.sglang_args(SCALE)
    fn = mod.flash_mla_sparse_decode_triton
    call = lambda: fn(*args)  # noqa: E731
    t = {}
    for _ in range(passes):
        for patched in (False, True):
            (integration.patch if patched else integration.unpatch)()
            for graph in (False, True):
                key = f"{'patched' if patched else 'unpatched'}_{'graph' if graph else 'eager'}_us"
                t.setdefault(key, []).append(bench.time_ms(call, graph=graph) * 1e3)
    integration.unpatch()
    row = dict(B=B, plans=plans(B), **{k: min(v) for k, v in t.items()}, passes={k: v for k, v in t.items()})
    for how in ("eager", "graph"):
        row[f"speedup_{how}"] = row[f"unpatched_{how}_us"] / row[f"patched_{how}_us"]
    return row


def indexer_rows(B=32, heads=64, live=LIVE):
    rows = []
    sglang_fn = fallback.sglang_function()
    for max_seq_len in INDEXER_MAX_SEQ_LENS:
        try:
            inp = make_indexer_inputs(B, heads, max_seq_len, seq_lens=live, seed=max_seq_len, device=DEVICE,
                                      q_dtype=torch.float8_e4m3fn)
            args = (inp.q.unsqueeze(1), inp.cache.kv, inp.weights.float(), inp.seq_lens, inp.page_table, None,
                    max_seq_len, False)
            sg = sglang_fn(*args)
            lab = integration.lab_paged_mqa_logits(*args)
            row = dict(B=B, H=heads, live=live, max_seq_len=max_seq_len, lab_vs_sglang_logits=rel_err(lab, sg))
            row["passed"] = bool(row["lab_vs_sglang_logits"] <= INDEXER_BF16_TOL)
            row["sglang_graph_us"] = bench.time_ms(lambda: sglang_fn(*args), graph=True) * 1e3
            row["lab_graph_us"] = bench.time_ms(lambda: integration.lab_paged_mqa_logits(*args), graph=True) * 1e3
            row["speedup_graph"] = row["sglang_graph_us"] / row["lab_graph_us"]
        except Exception:  # a failing case is a row, not the end of the run
            row = dict(B=B, max_seq_len=max_seq_len, error=_error())
        rows.append(row)
        print("indexer", row, flush=True)
    return rows


def main(argv):
    """``main([OUT.json, "--cpu-smoke"?])``, as the command line takes it."""
    args = [a for a in argv if a != "--cpu-smoke"]
    if len(args) != 1:
        sys.exit(__doc__.split("\n\n")[1])
    path = args[0]
    t0 = time.time()
    result = dict(what=__doc__.split("\n\n")[0], shapes=dict(H=H, window_k=WINDOW_K, window_context=WINDOW_CONTEXT,
                                                         window_page=256, topk=TOPK, live=LIVE, compressed_page=64,
                                                         sink=True, softmax_scale=SCALE),
                  tolerances=dict(out=OUT_TOL, lse=LSE_TOL, patched_vs_unpatched_out=VS_SIMT_TOL,
                                  indexer_lab_vs_sglang=INDEXER_BF16_TOL),
                  checks=[], timings=[], indexer=[])
    try:
        mod = integration.decode_module()
        result["sglang_module"] = mod.__name__
    except Exception:
        result["error"] = _error()
        ab.write(path, "sglang_patch", SMOKE, **result)
        print("setup failed:", result["error"], flush=True)
        return
    for B in BATCHES:
        try:
            with sglang_peer.one_config_when_interpreting(mod):
                row = check(mod, B)
        except Exception:
            row = dict(B=B, error=_error())
        integration.unpatch()
        result["checks"].append(row)
        print("check", row, flush=True)
    result["rows"] = result["checks"]
    ab.write(path, "sglang_patch", SMOKE, **result)
    if SMOKE:
        return
    for B in BATCHES:
        try:
            row = timings(mod, B)
        except Exception:
            integration.unpatch()
            row = dict(B=B, error=_error())
        result["timings"].append(row)
        print("timing", {k: v for k, v in row.items() if k != "passes"}, flush=True)
        torch.cuda.empty_cache()
    ab.write(path, "sglang_patch", SMOKE, **result)
    result["indexer"] = indexer_rows()
    result["lab_calls"] = integration.calls()
    result["elapsed_s"] = round(time.time() - t0, 1)
    ab.write(path, "sglang_patch", SMOKE, **result)
    print(f"wrote {path} in {result['elapsed_s']} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
