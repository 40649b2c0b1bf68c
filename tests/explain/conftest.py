"""Shared fixtures of the chapter 16 tests: the committed models (loaded once) and the
reference attributions."""

import os

import numpy as np
import pytest

from mlsys_lab.explain import models

REFERENCE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                         "captum_reference.npz")


@pytest.fixture(scope="session")
def chapter_models():
    return models.load()


@pytest.fixture(scope="session")
def reference():
    with np.load(REFERENCE, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
