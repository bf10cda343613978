"""The DSv4 cache layouts: byte positions, round trips within the fp8 bound, odd sizes."""
import pytest
import torch

from dsv4lab import cache as C


@pytest.mark.parametrize("page_size,expect", [(64, 37440), (256, 149760), (1, 1152), (3, 2304)])
def test_page_bytes_formula(page_size, expect):
    assert C.page_bytes(page_size) == expect
    assert C.page_bytes(page_size) % 576 == 0
    assert C.page_bytes(page_size) >= page_size * 584


def _nope_bound(x, deq):
    """fp8 e4m3 with a power-of-two scale: relative half-ulp 2^-4 for normals, plus the
    subnormal half-step 2^-10 * scale (scale = 2^ceil(log2(amax/448)) per 64-value tile)."""
    t = x.reshape(-1, 7, 64)
    scale = torch.exp2(torch.ceil(torch.log2(t.abs().amax(-1).clamp_min(1e-8) / 448)))
    bound = 2**-4 * t.abs() + 2**-10 * scale[..., None]
    return ((deq.reshape(-1, 7, 64) - t).abs() <= bound + 1e-12).all()


@pytest.mark.parametrize("n,page_size", [(1, 64), (63, 64), (64, 64), (65, 64), (300, 256), (257, 256), (7, 3)])
def test_kv_round_trip(n, page_size, dev):
    kv = torch.randn(n, 512, device=dev) * torch.logspace(-3, 2, n, device=dev)[:, None]
    c = C.pack_kv(kv, page_size)
    assert c.num_tokens == n and c.page_size == page_size
    assert c.num_pages == -(-n // page_size)
    d = C.dequant_kv(c, torch.arange(n))
    assert d.dtype == torch.float32 and d.shape == (n, 512)
    assert _nope_bound(kv[:, :448], d[:, :448])
    assert torch.equal(d[:, 448:], kv[:, 448:].bfloat16().float())   # rope is stored in bf16


def test_kv_byte_layout_by_hand(dev):
    """Token t: data at page*page_bytes + slot*576, scales at page*page_bytes + ps*576 + slot*8."""
    ps, n = 64, 130
    kv = torch.randn(n, 512, device=dev)
    c = C.pack_kv(kv, ps)
    assert c.buffer.dtype == torch.uint8 and c.buffer.shape == (3, C.page_bytes(ps))
    nope, scales = C.quantize_nope(kv[:, :448])
    for t in [0, 1, 63, 64, 65, 129]:
        base = (t // ps) * c.page_bytes
        row = c.buffer.reshape(-1)[base + (t % ps) * 576: base + (t % ps) * 576 + 576]
        assert torch.equal(row[:448], nope[t].view(torch.uint8))
        assert torch.equal(row[448:].view(torch.bfloat16), kv[t, 448:].bfloat16())
        s = c.buffer.reshape(-1)[base + ps * 576 + (t % ps) * 8: base + ps * 576 + (t % ps) * 8 + 8]
        assert torch.equal(s[:7], scales[t]) and s[7] == 0
    # slots past the last token and the page padding stay zero
    assert c.buffer[2, (n % ps) * 576: ps * 576].eq(0).all()
    assert c.buffer[:, ps * 584:].eq(0).all()


def test_ue8m0_scale_is_power_of_two_covering_amax(dev):
    kv = torch.randn(10, 512, device=dev) * 37.0
    _, e = C.quantize_nope(kv[:, :448])
    scale = torch.exp2(e.float() - 127)
    amax = kv[:, :448].reshape(10, 7, 64).abs().amax(-1)
    assert (amax / scale <= 448).all() and (amax / scale > 224).all()


def test_k_cache_view_matches_sglang_contract(dev):
    c = C.pack_kv(torch.randn(100, 512, device=dev), 64)
    k = c.k_cache
    assert k.dtype == torch.float8_e4m3fn
    assert tuple(k.shape) == (2, 64, 1, 584)
    assert k.stride(0) == c.page_bytes == 37440
    assert k.data_ptr() == c.buffer.data_ptr()


def test_to_device_round_trip(dev):
    c = C.pack_kv(torch.randn(5, 512, device=dev), 64)
    c2 = c.to("cpu").to(dev)
    assert torch.equal(c2.buffer, c.buffer) and c2.num_tokens == 5


@pytest.mark.parametrize("n", [1, 64, 100])
def test_index_k_round_trip_and_layout(n, dev):
    k = torch.randn(n, 128, device=dev) * 3
    c = C.pack_index_k(k)
    assert c.kv.dtype == torch.uint8 and tuple(c.kv.shape) == (-(-n // 64), 64, 1, 132)
    d = C.dequant_index_k(c, torch.arange(n))
    scale = k.abs().amax(-1, keepdim=True) / 448
    assert ((d - k).abs() <= 2**-4 * k.abs() + 2**-10 * scale + 1e-12).all()
    # page = [64*128 fp8 | 64 fp32 scales]
    page = c.kv[0].reshape(-1)
    assert torch.allclose(page[64 * 128: 64 * 128 + 4].view(torch.float32), scale[0])


def test_cache_errors(dev):
    with pytest.raises(ValueError, match=r"kv must have shape \[N, 512\]"):
        C.pack_kv(torch.randn(4, 511, device=dev))
    with pytest.raises(TypeError, match="kv must be a floating tensor"):
        C.pack_kv(torch.ones(4, 512, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        C.pack_kv(torch.randn(4, 512, device=dev), 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        C.pack_kv(torch.full((2, 512), float("nan"), device=dev))
    with pytest.raises(ValueError, match="at least one token"):
        C.pack_kv(torch.randn(0, 512, device=dev))
    c = C.pack_kv(torch.randn(4, 512, device=dev))
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 4\)"):
        C.dequant_kv(c, torch.tensor([0, 4]))
    with pytest.raises(TypeError, match="token_ids must be an integer tensor"):
        C.dequant_kv(c, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="page_size must be 64"):
        C.pack_index_k(torch.randn(4, 128, device=dev), 32)


def test_quantizer_refuses_non_finite_values(dev):
    kv = torch.randn(4, 512, device=dev, dtype=torch.float64)
    for bad in (float("inf"), float("nan"), 1e300):          # 1e300: inf once quantized in fp32
        kv[1, 5] = bad
        with pytest.raises(ValueError, match="NaN or inf|must be finite"):
            C.pack_kv(kv)


def test_e4m3_bit_trick_model_is_exact_for_every_byte():
    """kernels.decode.kv_tiles' fp8 -> bf16 integer dequant (its constants, through the numpy model):
    every e4m3 byte but NaN, every scale byte up to MAX_SCALE_BYTE, equals e4m3 * 2^(e-127)."""
    import numpy as np
    from dsv4lab.kernels.decode.kv_tiles import MAX_SCALE_BYTE, e4m3_bits_to_bf16_model
    x = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
    want = torch.from_numpy(x).view(torch.float8_e4m3fn).double().numpy()
    for e in range(0, MAX_SCALE_BYTE + 1):
        got = e4m3_bits_to_bf16_model(x, np.full(x.shape, e, dtype=np.uint8)).astype(np.float64)
        np.testing.assert_array_equal(got, want * 2.0 ** (e - 127), err_msg=f"scale byte {e}")
    assert np.signbit(e4m3_bits_to_bf16_model(np.array([0x80], np.uint8), np.array([127], np.uint8)))[0]
    # past MAX_SCALE_BYTE the factor is NaN (not inf, not a wrapped exponent): zeros included
    for e in (MAX_SCALE_BYTE + 1, MAX_SCALE_BYTE + 2, 200, 255):
        assert np.isnan(e4m3_bits_to_bf16_model(x, np.full(x.shape, e, dtype=np.uint8))).all()
