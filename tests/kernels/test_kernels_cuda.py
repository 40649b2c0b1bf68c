"""The CUDA GEMM ladder (book §8.4) under Numba's CUDA simulator (see conftest.py).

Every variant runs at small tile sizes (``SIMULATOR_CONFIGS``: the same kernels, compiled with
smaller compile-time tiles) on odd sizes that cut through tiles; the book's full-size
configurations run once each on a size just past one block tile.
"""

import json

import numpy as np
import pytest
from numba import cuda

from mlsys_lab.errors import DTypeError, ShapeError
from mlsys_lab.kernels import cuda as kc
from mlsys_lab.kernels import gpu_results as gr

SHAPES = [(37, 29, 53), (17, 33, 9), (5, 1, 19)]  # (M, K, N): none a multiple of a tile


def operands(m, k, n, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype),
            rng.standard_normal((k, n)).astype(dtype))


def assert_matmul(c, a, b, rtol=1e-4):
    expected = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == expected.shape and c.dtype == a.dtype
    np.testing.assert_allclose(c, expected, rtol=rtol, atol=rtol * np.sqrt(a.shape[1]))


def test_variants_in_the_books_order():
    assert list(kc.VARIANTS) == ["naive", "thread_tile", "block_tile", "shared",
                                 "shared_transposed", "shared_prefetch", "double_buffer"]
    assert [row.variant for row in gr.BOOK_RTX3080] == list(kc.VARIANTS) + ["cublas"]
    for name, fn in kc.VARIANTS.items():
        assert fn.__name__ == f"matmul_{name}" and fn.__doc__


@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("variant", list(kc.VARIANTS))
def test_variant_matches_numpy(variant, m, k, n):
    a, b = operands(m, k, n)
    assert_matmul(kc.matmul(a, b, variant, config=kc.SIMULATOR_CONFIGS[variant]), a, b)


@pytest.mark.parametrize("variant, shape", [
    ("naive", (17, 33, 9)),          # 16×16 threads
    ("thread_tile", (65, 5, 7)),     # 64×64 block tile, 16×16 threads
    ("block_tile", (129, 17, 7)),    # 128×128×16 block tile, 16×16 threads, 8×8 each
    ("shared", (129, 17, 7)),
    ("double_buffer", (129, 17, 7)),
])
def test_book_configuration_past_one_tile(variant, shape):
    a, b = operands(*shape, seed=1)
    assert_matmul(kc.VARIANTS[variant](a, b), a, b)


def test_float64():
    a, b = operands(19, 13, 11, np.float64)
    for variant in ("naive", "double_buffer"):
        c = kc.matmul(a, b, variant, config=kc.SIMULATOR_CONFIGS[variant])
        assert_matmul(c, a, b, rtol=1e-12)
    assert kc.default_config("double_buffer", np.float64).block_k == 8  # fits 48 KiB


def test_device_arrays_round_trip():
    a, b = operands(17, 33, 9)
    cfg = kc.SIMULATOR_CONFIGS["shared_prefetch"]
    d_c = kc.matmul_shared_prefetch(cuda.to_device(a), cuda.to_device(b), config=cfg)
    assert not isinstance(d_c, np.ndarray) and hasattr(d_c, "copy_to_host")
    assert_matmul(d_c.copy_to_host(), a, b)
    out = cuda.device_array((17, 9), np.float32)
    assert kc.matmul(a, cuda.to_device(b), "shared", out=out,
                     config=kc.SIMULATOR_CONFIGS["shared"]) is out
    assert_matmul(out.copy_to_host(), a, b)


def test_non_contiguous_numpy_input_is_copied():
    a, b = operands(9, 6, 7)
    at = np.asfortranarray(a)
    assert_matmul(kc.matmul(at, b, "naive", config=kc.SIMULATOR_CONFIGS["naive"]), a, b)


def test_empty_dimensions():
    assert kc.matmul(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)).tolist() == \
        np.zeros((3, 4)).tolist()
    assert kc.matmul(np.zeros((0, 5), np.float32), np.zeros((5, 4), np.float32)).shape == (0, 4)


def test_shape_error_names_op_and_shapes():
    a, b = operands(4, 5, 6)
    with pytest.raises(ShapeError, match=r"matmul.*\(4, 5\).*\(4, 6\)"):
        kc.matmul_naive(a, b[:4])
    with pytest.raises(ShapeError, match="matmul"):
        kc.matmul_double_buffer(a[0], b)
    assert issubclass(ShapeError, ValueError)


def test_dtype_errors():
    a, b = operands(4, 5, 6)
    with pytest.raises(DTypeError, match="float32.*float64|float64.*float32"):
        kc.matmul_shared(a, b.astype(np.float64))
    with pytest.raises(DTypeError, match="int64"):
        kc.matmul_naive(a.astype(np.int64), b.astype(np.int64))
    assert issubclass(DTypeError, TypeError)


def test_bad_config_and_variant():
    a, b = operands(4, 5, 6)
    with pytest.raises(ValueError, match="multiples of 4"):
        kc.matmul_shared(a, b, config=kc.TileConfig(2, 2, 6, 8, 4))
    with pytest.raises(ValueError, match="1024"):
        kc.matmul_naive(a, b, config=kc.TileConfig(64, 64, 1, 1, 1))
    with pytest.raises(ValueError, match="unknown variant"):
        kc.matmul(a, b, "tensor_core")


def test_book_table():
    book = {row.variant: row for row in gr.BOOK_RTX3080}
    assert (book["naive"].ms, book["naive"].gflops) == (48.961, 185.313)
    assert (book["double_buffer"].ms, book["double_buffer"].gflops) == (0.542, 15838.302)
    assert (book["cublas"].ms, book["cublas"].gflops) == (0.613, 14002.600)
    assert gr.BOOK_RTX3080_PEAK_GFLOPS == 29767.68
    m, n, k = gr.BOOK_SHAPE
    for row in gr.BOOK_RTX3080[1:]:  # the naive row is the book's one inconsistent row
        assert 2 * m * n * k / (row.ms * 1e-3) / 1e9 == pytest.approx(row.gflops, rel=2e-3)


def test_results_file_round_trip(tmp_path):
    rows = [dict(variant="cublas", m=2048, n=2048, k=1024, ms=0.2, gflops=42949.7,
                 ratio_to_cublas=1.0, max_rel_error=0.0, correct=True),
            dict(variant="double_buffer", m=2048, n=2048, k=1024, ms=0.25, gflops=34359.7,
                 ratio_to_cublas=0.8, max_rel_error=1e-6, correct=True),
            dict(variant="double_buffer", m=4096, n=4096, k=4096, ms=3.0, gflops=45812.7,
                 ratio_to_cublas=0.9, max_rel_error=1e-6, correct=True)]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(dict(device="NVIDIA H200", date="2025-01-01T00:00:00+00:00",
                                    numba_version="0.68.1", reference="torch", rows=rows)))
    results = gr.load_gpu_results(path)
    table = gr.results_table(results)
    assert [r["variant"] for r in table] == [r.variant for r in gr.BOOK_RTX3080]
    final = table[6]
    assert final["book_ms"] == 0.542 and final["ms"] == 0.25 and final["ratio_to_cublas"] == 0.8
    assert table[0]["ms"] is None  # naive not measured in this file
    assert gr.results_table(results, shape=(4096, 4096, 4096))[6]["ms"] == 3.0
    assert gr.results_table()[7]["book_gflops"] == 14002.600
    assert "NVIDIA H200" in gr.results_header(results)
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="missing"):
        gr.load_gpu_results(path)
