import pytest


@pytest.fixture(params=["native", "python"])
def hook_kind(request, monkeypatch):
    """Run a test on the guard's native profile hook and on its Python hook alone (what a guard
    gets where ``native_hook`` cannot be built): the latter takes the native hook out of
    ``check()``'s seal for the test."""
    from mlsys_lab.grading.core import guard

    if request.param == "python":
        monkeypatch.setitem(guard._local_seal(), "native", None)
    return request.param
