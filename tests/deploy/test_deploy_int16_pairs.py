"""The model of an x86 u8 x s8 kernel without VNNI (``vpmaddubsw``: products summed in adjacent
pairs into saturating int16), checked against a plain loop that states the definition. Its
agreement with onnxruntime's optimised session is in test_deploy_qdq.py."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.deploy.quant import int16_pairs
from mlsys_lab.deploy.quant.int16_pairs import pair_sums_matmul


def _loop(a, w):
    """The definition, one output at a time: Σ over pairs (2i, 2i+1) of clip16(p0 + p1)."""
    m, k = a.shape
    out = np.zeros((m, w.shape[1]), np.int64)
    for i in range(m):
        for j in range(w.shape[1]):
            for p in range(0, k, 2):
                s = int(a[i, p]) * int(w[p, j])
                if p + 1 < k:
                    s += int(a[i, p + 1]) * int(w[p + 1, j])
                out[i, j] += min(max(s, -32768), 32767)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_pair_sums_match_the_definition(seed):
    rng = np.random.default_rng(seed)
    m, k, n = rng.integers(1, 6), rng.integers(1, 40), rng.integers(1, 6)   # odd k too
    hi = rng.integers(1, 256)
    a = rng.integers(0, hi, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    np.testing.assert_array_equal(pair_sums_matmul(a, w), _loop(a, w))


def test_one_pair_saturates_at_the_int16_limits():
    a = np.array([[255, 255]], np.uint8)
    assert pair_sums_matmul(a, np.array([[127], [127]], np.int8))[0, 0] == 32767   # not 64770
    assert pair_sums_matmul(a, np.array([[-128], [-128]], np.int8))[0, 0] == -32768
    # the same products split over two pairs do not saturate: the pairing is what matters
    a4 = np.array([[255, 0, 255, 0]], np.uint8)
    assert pair_sums_matmul(a4, np.full((4, 1), 127, np.int8))[0, 0] == 2 * 255 * 127


def test_seven_bit_weights_never_saturate():
    """reduce_range: |w| <= 63 keeps every pair within 2 * 255 * 63 = 32130."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 256, (4, 33)).astype(np.uint8)
        w = rng.integers(-64, 64, (33, 5)).astype(np.int8)
        np.testing.assert_array_equal(pair_sums_matmul(a, w),
                                      a.astype(np.int64) @ w.astype(np.int64))


def test_bad_operands_name_the_function():
    with pytest.raises(ml.DTypeError, match="pair_sums_matmul.*uint8 x int8"):
        pair_sums_matmul(np.zeros((2, 2), np.int8), np.zeros((2, 2), np.int8))
    with pytest.raises(ml.ShapeError, match=r"pair_sums_matmul.*\(2, 3\) @ \(2, 2\)"):
        pair_sums_matmul(np.zeros((2, 3), np.uint8), np.zeros((2, 2), np.int8))


@pytest.mark.parametrize("machine, features, want", [
    ("x86_64", {"avx2": True, "avx512vnni": True}, True),     # Zen 4/5, Ice Lake and later
    ("x86_64", {"avx2": True, "avxvnni": True}, True),        # Alder Lake's AVX-VNNI
    ("x86_64", {"avx2": True, "avx512bw": True}, False),      # Skylake-SP: vpmaddubsw too
    ("x86_64", {"avx2": True}, False),                        # Zen 3, Haswell
    ("aarch64", {"avx512vnni": True}, False),
])
def test_vnni_is_read_from_the_host(monkeypatch, machine, features, want):
    monkeypatch.setattr(int16_pairs.platform, "machine", lambda: machine)
    monkeypatch.setattr(int16_pairs.llvm, "get_host_cpu_features", lambda: features)
    assert int16_pairs.host_has_vnni() is want


def test_run_int16_pairs_changes_only_the_saturating_layers():
    from mlsys_lab import nn
    from mlsys_lab.deploy import passes as P
    from mlsys_lab.deploy import quant as Q
    from mlsys_lab.deploy.quant import int8_kernels as K

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    model = nn.Sequential(nn.Linear(64, 24, rng=0), nn.ReLU(), nn.Linear(24, 10, rng=1)).eval()
    graph = P.to_inference(model, x, passes=P.inference_pipeline(fuse=False)).graph
    for bits, saturates in ((8, True), (7, False)):
        qdq = Q.quantize_static(graph, Q.calibrate(graph, [x]), weight_bits=bits)
        lowered = K.lower_qdq(qdq)
        exact = P.run_numpy(lowered, x)[0]
        got = int16_pairs.run_int16_pairs(lowered, x)[0]
        assert bool(np.abs(got - exact).max() > 0) is saturates
