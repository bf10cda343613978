"""The kernel classifier (dsv4lab.profile.RULES) against the kernel names an H200 run launches
(torch 2.11, cuBLAS 13, the lab's and SGLang's Triton kernels), the interpreter's region rows,
the tables built from a profile, and a profile of a real (CPU) step.

When a GPU run's kernel dump is committed (data/runs/h200/reproduce/kernels.json, written by
``python -m dsv4lab reproduce``), every stage in it must leave < 5% of kernel time unclassified
and no kernel may have been launched from a region its category excludes.
"""
import json
from pathlib import Path

import pytest

from dsv4lab import profile as P
from dsv4lab.model import CPU_MODEL, Model
from dsv4lab.stages import Stage

EXPECTED = {
    P.DECODE: ["_tiled_sparse_decode_kernel", "_simt_decode_kernel", "_head_batched_kernel", "_story_kernel",
               "_combine_kernel", "_hopper_decode_kernel"],
    P.INDEXER: ["_indexer_kernel"],
    P.MOE: ["_moe_grouped_gemm_kernel"],
    P.FP32_GEMM: [
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
        "cutlass_80_simt_sgemm_128x64_8x5_nn_align1", "ampere_sgemm_32x128_tn",
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int>, float, float)",
        "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >(cublasGemmSmallNParams)",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, false, false>(cublasLt::cublasSplitKParams<float>)",
    ],
    P.BF16_GEMM: [
        "nvjet_tst_128x64_64x8_1x1_v_bz_coopA_NNT", "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>(Params)",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int> >(cublasGemvParamsEx<int>, float, float)",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>()",
    ],
    P.TOPK: [
        "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, unsigned int>)",
        "void at::native::mbtopk::radixFindKthValues<float, unsigned int, unsigned int, 2>(at::cuda::detail::TensorInfo)",
        "void at::native::mbtopk::computeBlockwiseWithinKCounts<unsigned int>(unsigned int*, short*, unsigned int)",
        "void at::native::mbtopk::computeBlockwiseKthCounts<unsigned int>(unsigned int*, short*, unsigned int)",
        "void at::native::mbtopk::gatherTopK<float, unsigned int, 2>(at::cuda::detail::TensorInfo<float const, unsigned int>)",
        "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>()",
        "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy>()",
    ],
    P.GLUE: [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
        "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4>()",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4, 4> >(at::native::ReduceOp<float>)",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<>>(long, at::native::gpu_index_kernel<>)",
        "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
        "unsigned int, 2, 128, 1>()",
        "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true, at::native::ReduceAdd>()",
        "void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out()>()",
        "Memcpy DtoD (Device -> Device)", "Memset (Device)", "_mhc_sinkhorn_kernel",
        "triton_poi_fused_add_mul_0", "triton_red_fused_mean_pow_rsqrt_1", "triton_per_fused_sum_2",
    ],
    P.OTHER: ["some_kernel_nobody_knows", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"],
}


@pytest.mark.parametrize("cat, name", [(c, n) for c, names in EXPECTED.items() for n in names])
def test_rules_classify_expected_h200_kernel_names(cat, name):
    assert P.classify(name) == cat


@pytest.mark.parametrize("name, cat", [
    ("dsv4::decode[sglang,c4]/python", P.DECODE), ("dsv4::decode[auto,c0]/aten::maximum", P.GLUE),
    ("dsv4::indexer[triton]/python", P.INDEXER), ("dsv4::indexer[torch_fp32]/aten::bmm", P.FP32_GEMM),
    ("dsv4::indexer[torch_bf16]/aten::bmm", P.BF16_GEMM), ("dsv4::mhc_linear[float32]/aten::mm", P.FP32_GEMM),
    ("dsv4::mhc_linear[bfloat16]/aten::mm", P.BF16_GEMM), ("dsv4::moe_experts/python", P.MOE),
    ("dsv4::indexer[torch_fp32]/aten::topk", P.TOPK), ("dsv4::sinkhorn/python", P.GLUE),
    ("dsv4::indexer_proj/python", P.OTHER), ("dsv4::attn_proj/aten::copy_", P.GLUE)])
def test_cpu_rows_use_their_own_rules(name, cat):
    assert P.classify(name) == cat


def test_profile_sums_shares_and_transition_table():
    kp = P.KernelProfile([dict(name="_story_kernel", us=300.0, calls=2), dict(name="Memset (Device)", us=600.0, calls=1),
                          dict(name="mystery", us=100.0, calls=1)], runs=1, source="test")
    cats = kp.by_category()
    assert cats[P.DECODE] == 300 and cats[P.GLUE] == 600 and kp.unclassified_share() == pytest.approx(0.1)
    before = {P.DECODE: 5350e3, P.GLUE: 3000e3}
    after = {P.DECODE: 850e3, P.GLUE: 3000e3}
    rows = P.transition_table(before, after, "S0", "S1")
    assert rows[0]["speedup"] == pytest.approx(5350 / 850) and rows[-1]["kernel category"] == "total kernel time"
    assert sum(r["S1 %"] for r in rows[:-1]) == pytest.approx(100)
    assert rows[-1]["S0 ms"] == pytest.approx(8350)


def test_region_mismatches_flag_a_rule_that_lies():
    ok = dict(name="nvjet_tst_x", category=P.BF16_GEMM, regions={"dsv4::attn_proj": 5.0})
    bad = dict(name="nvjet_tst_y", category=P.BF16_GEMM, regions={"dsv4::decode[auto,c4]": 5.0})
    glue = dict(name="Memset (Device)", category=P.GLUE, regions={"dsv4::decode[auto,c4]": 1.0})
    out = P.region_mismatches([ok, bad, glue])
    assert [m["name"] for m in out] == ["nvjet_tst_y"]


def test_cpu_profile_of_a_step_covers_the_categories():
    m = Model(CPU_MODEL)
    s = Stage("S0", "t", decode_impl="sglang", indexer_impl="torch_fp32")
    inp = m.inputs(1)
    prof, runs = P.profile_runs(lambda: m.step(inp, s), 1)
    kp = P.cpu_rows(prof, runs)
    cats = kp.by_category()
    for c in (P.DECODE, P.FP32_GEMM, P.GLUE, P.MOE, P.BF16_GEMM, P.TOPK):
        assert cats[c] > 0, c
    br = P.cpu_breakdown(kp)
    assert br.ops and sum(o["share"] for o in br.ops) == pytest.approx(1.0)
    assert any(o["op"] == "aten::bmm" for o in br.ops)            # the fp32 indexer bmm counts in the glue set


DUMP = Path(__file__).resolve().parents[1] / "data" / "runs" / "h200" / "reproduce" / "kernels.json"


@pytest.mark.skipif(not DUMP.exists(), reason="no GPU kernel dump committed yet (python -m dsv4lab reproduce)")
def test_recorded_gpu_kernels_are_classified():
    dump = json.loads(DUMP.read_text())
    cases = [(f"{s} C={c}", d) for s, per_c in dump["stages"].items() for c, d in per_c.items()]
    assert len(cases) >= 8, "the dump holds every stage's profiles"
    for stage, d in cases:
        ks = d["kernels"]
        for k in ks:
            k["category"] = P.classify(k["name"])                  # today's rules, not the recorded ones
        total = sum(k["us"] for k in ks)
        other = sum(k["us"] for k in ks if k["category"] == P.OTHER)
        assert other / total < 0.05, (stage, [k["name"] for k in ks if k["category"] == P.OTHER][:10])
        assert not P.region_mismatches(ks), stage


def test_op_breakdown_of_the_indexer_fallback(capfd):
    # one eager call inside a dsv4:: region, time charged to aten ops: the story's five among them,
    # the bmm counted with the glue only where it is the fp32 GEMM; nothing written to stderr
    import torch

    from dsv4lab.kernels.indexer import fallback
    from dsv4lab.testing import make_indexer_inputs
    inp = make_indexer_inputs(2, 16, 1024, seq_lens=64, seed=1)
    capfd.readouterr()
    ops = {}
    for name, dt in (("torch_fp32", torch.float32), ("torch_bf16", torch.bfloat16)):
        br = P.op_breakdown(lambda: fallback.logits_torch(*inp.args(), 1024, dt), f"dsv4::indexer[{name}]")
        assert sum(o["share"] for o in br.ops) == pytest.approx(1.0) and br.total_us > 0
        ops[name] = {o["op"] for o in br.ops}
    assert {"aten::copy_", "aten::mul", "aten::clamp_min", "aten::sum", "aten::bmm"} <= ops["torch_fp32"]
    assert "aten::bmm" not in ops["torch_bf16"]
    assert "profiler_start" not in capfd.readouterr().err
