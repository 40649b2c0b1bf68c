"""ONNX export of the embedding ops: a plain lookup (``take``) is a ``Gather`` node and runs in
onnxruntime; ``embedding_bag`` has no ONNX op, and exporting it fails with an error that names
the op and the node."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.errors import UnknownNameError

onnx_export = pytest.importorskip("mlsys_lab.deploy.onnx.exporter")


class Bags(ml.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = ml.nn.EmbeddingBag(10, 4, mode="sum", rng=0)

    def forward(self, ids, offsets):
        return self.bag(ids, offsets)


def test_embedding_exports_as_gather_and_runs_in_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    emb = ml.nn.Embedding(10, 4, rng=0)
    ids = np.array([[1, 7, 7], [0, 9, 3]])
    model = onnx_export.export_onnx(emb, (ids,))
    assert [n.op_type for n in model.graph.node] == ["Gather"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: ids})
    np.testing.assert_array_equal(got, emb(ids).numpy())


def test_embedding_bag_export_names_the_op_and_the_node():
    with pytest.raises(UnknownNameError, match=r"export_onnx: node #0 .*= embedding_bag .*op "
                                               r"'embedding_bag' has no ONNX mapping"):
        onnx_export.export_onnx(Bags(), (np.array([1, 2, 3]), np.array([0, 2])))
