"""Helpers that several chapter 8 exercises share: seeded operands and the product check (8.1
and 8.2), and reading a kernel's source (8.1's loop nest; 8.2's kernel on a real GPU).
"""

import ast
import inspect
import math
import textwrap

import numpy as np

from mlsys_lab.grading.core.exercise import describe


def operands(m, k, n, dtype, seed):
    """Seeded standard-normal operands ``a`` (m×k) and ``b`` (k×n) of ``dtype`` (both sides)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


def expect_product(c, a, b, what, rtol):
    """Assert that ``c`` is ``a @ b``: an ndarray of the right shape and dtype, close in value."""
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    if not isinstance(c, np.ndarray):
        raise AssertionError(f"{what} returned {describe(c)}; return a numpy array")
    if c.shape != expected.shape:
        raise AssertionError(f"{what} returned shape {c.shape}, expected {expected.shape}")
    if c.dtype != np.asarray(a).dtype:
        raise AssertionError(
            f"{what} returned dtype {c.dtype}; keep the inputs' dtype {np.asarray(a).dtype}"
        )
    scale = rtol * (1 + np.abs(expected).max()) * math.sqrt(max(np.asarray(a).shape[1], 1))
    err = float(np.abs(c.astype(np.float64) - expected).max()) if c.size else 0.0
    if not err <= scale:
        where = np.unravel_index(np.argmax(np.abs(c - expected)), c.shape)
        raise AssertionError(
            f"{what}: off by up to {err:.3g} (worst at c{list(map(int, where))}); "
            f"expected a @ b within {scale:.1g}"
        )


def source_of(fn):
    """The source text of a Python function (a kernel's ``py_func``), or None."""
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def function_def(source):
    """The first function definition in ``source`` (judge side)."""
    tree = ast.parse(source)
    return next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def names_in(node):
    """Every variable name read or written anywhere under an AST ``node``."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
