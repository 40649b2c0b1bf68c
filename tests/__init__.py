"""The test suite, laid out like the package: ``tests/<package>/`` holds the tests of
``mlsys_lab/<package>/`` (engine, kernels, nn, data, deploy, distributed, recsys, viz, reader,
grading, cli); ``tests/notebooks/`` the checks on the committed notebooks and the exercises'
grading round trips; the root the tests of the package's top-level modules and the shared
helpers (``conformance``, ``gradcheck``, ``processes``, ``exercise_results``, ``conftest``)
and the browser's screenshots (``artifacts/``). ``data/`` also keeps the committed answers of the
reference libraries and the scripts that write them (``torch_reference.npz`` for the conformance
cases, ``torch_misc_reference.npz`` for single features, Captum's, Opacus', Gymnasium's,
python-control's), so no test needs those libraries installed."""
