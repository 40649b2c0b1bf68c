"""Exported ONNX models: mlsys_lab's compiled executor vs onnxruntime (book chapter 10).

    python benchmarks/deploy_onnx.py [--quick] [--rounds 20] [--threads 0] [--no-zoo]

Models: the MLP 784-256-256-10 (``nn.zoo.mlp``) and the small ResNet-style CNN of the chapters
(``nn.zoo.resnet_cnn``: 1x8x8 input, 8 channels, 2 residual blocks with batch norm), each in
eval mode, exported with ``export_onnx`` once per batch size (1 and 32; the graph's shapes are
static). Contestants on the *same exported model*: onnxruntime (the baseline), and
``ml.compile`` of the graph that ``import_onnx`` reads back from it. Timing is interleaved,
best of ``--rounds`` after a warm-up (``mlsys_lab.timing.compare``); every contestant's output is
first checked against mlsys_lab's eager result. Target: compiled within 2x of onnxruntime on the
MLP at batch 32.

The zoo section imports every model of the "light" zoo inside the onnx wheel (weights given
random He-scaled values: the stored ones are constant fills), runs it compiled and in
onnxruntime, and prints the largest difference of the logits (relative to their scale) and
both latencies.
"""

import argparse
import os
import time

import numpy as np

import mlsys_lab as ml
from mlsys_lab import timing
from mlsys_lab.deploy import export_onnx, import_onnx
from mlsys_lab.nn import zoo

try:
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
except ImportError as e:  # pragma: no cover
    raise SystemExit(f"benchmarks/deploy_onnx.py needs onnx and onnxruntime ({e})") from None

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
ZOO = ("squeezenet", "shufflenet", "inception_v1", "inception_v2", "resnet50", "densenet121",
       "bvlc_alexnet", "zfnet512", "vgg19")


def session(model, threads):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3  # errors only
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def models():
    mlp = zoo.mlp((784, 256, 256, 10), seed=0)
    cnn = zoo.resnet_cnn(channels=8, blocks=2, image=8, seed=0)
    for m in (mlp, cnn):
        m.eval()
    return {"MLP 784-256-256-10": (mlp, (784,)), "CNN resnet_cnn 1x8x8": (cnn, (1, 8, 8))}


def onnx_vs_compiled(name, model, x, rounds, threads):
    """Export ``model`` at ``x``'s batch size, run the file in onnxruntime and (imported)
    compiled by mlsys_lab, check both against the eager output and print one timing row."""
    exported = export_onnx(model, (x,))
    sess = session(exported, threads)
    feed = {sess.get_inputs()[0].name: x}
    compiled = ml.compile(import_onnx(exported), x)
    want = model(ml.tensor(x)).numpy()
    err = max(float(np.abs(sess.run(None, feed)[0] - want).max()),
              float(np.abs(np.asarray(compiled(x)) - want).max()))
    result = timing.compare({"onnxruntime": lambda: sess.run(None, feed),
                             "ml compiled": lambda: compiled(x)},
                            rounds=rounds, block=5, warmup=3)
    print(f"{name:<26} {len(x):>5} {result['onnxruntime'] * 1e3:>10.3f}ms "
          f"{result['ml compiled'] * 1e3:>10.3f}ms {result.ratio('ml compiled'):>5.2f}x "
          f"{err:>9.2e}")
    return result


MODELS_HEADER = (f"{'model':<26} {'batch':>5} {'onnxruntime':>12} {'ml compiled':>12} "
                 f"{'ratio':>6} {'max err':>9}")


def bench_models(args):
    print(MODELS_HEADER)
    for name, (model, shape) in models().items():
        for batch in (1, 32):
            x = np.random.default_rng(batch).standard_normal((batch,) + shape).astype(np.float32)
            onnx_vs_compiled(name, model, x, args.rounds, args.threads)


def randomized(model, seed=0):
    """The light models' ConstantOfShape weights as He-scaled random initializers (biases and
    batch-norm shifts small, scales and variances near 1); the logits become the last output."""
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    readers = {name: (n.op_type, i) for n in g.node for i, name in enumerate(n.input)}
    kept = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            if len(shape) > 1:
                arr = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
            elif readers.get(node.output[0]) in (("BatchNormalization", 1),
                                                 ("BatchNormalization", 4)):
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = rng.uniform(-0.1, 0.1, shape)
            g.initializer.append(numpy_helper.from_array(arr.astype(np.float32), node.output[0]))
            g.input.append(onnx.helper.make_tensor_value_info(node.output[0],
                                                              onnx.TensorProto.FLOAT, shape))
        else:
            kept.append(node)
    del g.node[:]
    g.node.extend(kept)
    _drop_unread(g)
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if softmax:  # the logits too (DenseNet-121 ends without a softmax)
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        g.output.append(next(v for v in inferred if v.name == softmax[0].input[0]))
    return model


def _flat(outputs):
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _drop_unread(g):
    """Remove the initializers (and their input entries) that no node reads any more."""
    read = {name for n in g.node for name in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in read]
    del g.initializer[:]
    g.initializer.extend(keep)
    inputs = [i for i in g.input if i.name in read]
    del g.input[:]
    g.input.extend(inputs)


def bench_zoo(args):
    print(f"\n{'light zoo model':<16} {'nodes':>5} {'import':>8} {'onnxruntime':>12} "
          f"{'ml compiled':>12} {'ratio':>6} {'logit err/scale':>15}")
    for name in ZOO[:3] if args.quick else ZOO:
        model = randomized(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")))
        start = time.perf_counter()
        graph = import_onnx(model)
        imported = time.perf_counter() - start
        x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
        sess = session(model, args.threads)
        feed = {graph.inputs[0].name: x}
        compiled = ml.compile(graph, x)
        theirs, ours = sess.run(None, feed)[-1], np.asarray(_flat(compiled(x))[-1])
        err = float(np.abs(ours - theirs).max() / max(1.0, np.abs(theirs).max()))
        result = timing.compare({"onnxruntime": lambda: sess.run(None, feed),
                                 "ml compiled": lambda: compiled(x)},
                                rounds=max(2, args.rounds // 10), warmup=1)
        print(f"{name:<16} {len(graph.nodes):>5} {imported:>7.2f}s "
              f"{result['onnxruntime'] * 1e3:>10.1f}ms {result['ml compiled'] * 1e3:>10.1f}ms "
              f"{result.ratio('ml compiled'):>5.2f}x {err:>15.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, three zoo models")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--no-zoo", action="store_true", help="skip the light zoo section")
    args = parser.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 5)
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, {os.cpu_count()} CPUs, "
          f"onnxruntime threads: {args.threads or 'default'}; times: best of {args.rounds}\n")
    bench_models(args)
    if not args.no_zoo:
        bench_zoo(args)


if __name__ == "__main__":
    main()
