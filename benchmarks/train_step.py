"""One SGD training step: eager mlsys_lab vs the same step hand-written in numpy and in PyTorch.

    python benchmarks/train_step.py [--repeats 50] [--models mlp,cnn,transformer]

For two MLPs it prints the median time of each and the ratios eager / numpy (target: <= 1.5x)
and compiled / numpy (``ml.compile_train_step``: forward, backward and update in one planned
graph; target <= 0.9x), plus the ratios to PyTorch eager when torch is importable (optional;
measured in alternating blocks, see ``TORCH_BLOCK``; target compiled <= 1.0x). Everything uses
float32 and the same BLAS. The last columns time the step's matrix products alone (into
preallocated buffers): about the floor under any implementation of the step on this machine.

Two more rows have no hand-written numpy step (``n/a``): the small CNN of issue 12 (conv 3->16
3x3, ReLU, max-pool 2, conv 16->32 3x3, ReLU, max-pool 2, linear 2048->10; batch 32 of
3x32x32; target eager and compiled <= 2x PyTorch) and chapter 7's transformer block
(``nn.zoo.TransformerClassifier``, dim 32, 4 heads, batch 8 of 16 tokens). PyTorch runs the
same step with the same weights, functionally, and the losses must agree before anything is
timed.
"""

import argparse

import numpy as np

import mlsys_lab as ml
from mlsys_lab import nn, ops, timing
from mlsys_lab.nn import zoo

CONFIGS = [((784, 256, 256, 10), 64), ((784, 1024, 1024, 10), 256)]
CNN_BATCH, TRANSFORMER_INPUT = 32, (8, 16, 32)
LR = 0.01
# PyTorch's OpenMP threads keep spinning for a while after its last op and would slow whatever
# runs next, so the columns against torch are timed in alternating blocks of TORCH_BLOCK calls
# per contestant, the first TORCH_SETTLE calls of each block dropped (threads quieting down);
# alternating blocks still spread machine-load drifts over every contestant.
TORCH_BLOCK, TORCH_SETTLE = 40, 10


def make_params(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [((rng.uniform(-1, 1, (a, b)) / np.sqrt(a)).astype(np.float32),
             np.zeros(b, np.float32)) for a, b in zip(sizes[:-1], sizes[1:])]


def numpy_step(params, x, y):
    """Forward, softmax cross-entropy, backward and SGD update, written by hand."""
    acts, h = [x], x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = np.maximum(h, 0)
        acts.append(h)
    z = h - h.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = -np.log(p[np.arange(n), y]).mean()
    g = p
    g[np.arange(n), y] -= 1
    g /= n
    for i in range(len(params) - 1, -1, -1):
        w, b = params[i]
        gw, gb = acts[i].T @ g, g.sum(axis=0)
        if i:
            g = (g @ w.T) * (acts[i] > 0)
        w -= LR * gw
        b -= LR * gb
    return loss


def gemm_floor_fn(params, x):
    """Only the step's matrix products (3 per layer but the first, which has no input
    gradient), into preallocated buffers: the floor no implementation of the step can beat
    with this BLAS. The gradients are random stand-ins of the right shapes."""
    rng = np.random.default_rng(1)
    n = x.shape[0]
    acts = [x] + [np.empty((n, w.shape[1]), np.float32) for w, _ in params]
    grads = [rng.standard_normal((n, w.shape[1])).astype(np.float32) for w, _ in params]
    gws = [np.empty_like(w) for w, _ in params]
    gxs = [np.empty((n, w.shape[0]), np.float32) for w, _ in params]

    def step():
        for i, (w, _) in enumerate(params):
            np.matmul(acts[i], w, out=acts[i + 1])
        for i in range(len(params) - 1, -1, -1):
            np.matmul(acts[i].T, grads[i], out=gws[i])
            if i:
                np.matmul(grads[i], params[i][0].T, out=gxs[i])

    return step


def build_mlsys(sizes, params):
    layers = []
    for i, (w, b) in enumerate(params):
        lin = nn.Linear(w.shape[0], w.shape[1])
        lin.weight.data, lin.bias.data = w.copy(), b.copy()
        layers += [lin] + ([nn.ReLU()] if i < len(params) - 1 else [])
    model = nn.Sequential(*layers)
    return model, ml.optim.SGD(model.parameters(), lr=LR)


def mlsys_step(model, opt, x, y):
    loss = ops.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def torch_step_fn(params):
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    ws = [(torch.tensor(w.copy(), requires_grad=True), torch.tensor(b.copy(), requires_grad=True))
          for w, b in params]
    opt = torch.optim.SGD([t for pair in ws for t in pair], lr=LR)

    def step(x, y):
        h = x
        for i, (w, b) in enumerate(ws):
            h = h @ w + b
            if i < len(ws) - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


# --- the CNN and the transformer block: mlsys_lab models and the same steps in PyTorch ----------
def build_cnn():
    """Issue 12's CNN as an ``nn.Sequential`` (NCHW, OIHW weights, Linear weight (in, out))."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, rng=0), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1, rng=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10, rng=2))
    return model, ml.optim.SGD(model.parameters(), lr=LR)


def torch_cnn(T, p, x):
    F = T.nn.functional
    h = F.max_pool2d(F.relu(F.conv2d(x, p["0.weight"], p["0.bias"], padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["3.weight"], p["3.bias"], padding=1)), 2)
    return h.flatten(1) @ p["7.weight"] + p["7.bias"]


def build_transformer():
    """Chapter 7's transformer block with a mean-pooled linear head."""
    model = zoo.TransformerClassifier(dim=32, heads=4, hidden=64, seed=0)
    return model, ml.optim.SGD(model.parameters(), lr=LR)


def torch_transformer(T, p, x, heads=4):
    """``zoo.TransformerClassifier.forward`` in PyTorch, from the same parameters."""
    F = T.nn.functional
    b, t, d = x.shape

    def linear(h, name):
        return h @ p[f"{name}.weight"] + p[f"{name}.bias"]

    def norm(h, name):
        return F.layer_norm(h, (d,), p[f"{name}.weight"], p[f"{name}.bias"], 1e-5)

    qkv = linear(norm(x, "block.ln1"), "block.qkv").reshape(b, t, 3, heads, d // heads)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    att = T.softmax(q @ k.transpose(2, 3) / float(np.sqrt(d // heads)), dim=-1)
    x = x + linear((att @ v).transpose(1, 2).reshape(b, t, d), "block.proj")
    x = x + linear(T.relu(linear(norm(x, "block.ln2"), "block.fc1")), "block.fc2")
    return linear(x.mean(dim=1), "head")


def torch_model_step_fn(forward, model):
    """A PyTorch SGD step of ``forward(torch, params, x)`` from ``model``'s parameters."""
    import torch

    params = {k: torch.tensor(v.numpy().copy(), requires_grad=True)
              for k, v in model.named_parameters()}
    opt = torch.optim.SGD(list(params.values()), lr=LR)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(forward(torch, params, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


MODELS = {"cnn": ("cnn 3-16-32 + linear", build_cnn, torch_cnn, (CNN_BATCH, 3, 32, 32)),
          "transformer": ("transformer block d32", build_transformer, torch_transformer,
                          TRANSFORMER_INPUT)}


def torch_columns(eager, compiled, make_torch_step, x, y, repeats, expected_loss=None):
    """The columns against PyTorch (torch ms, eager/torch, compiled/torch), timed in blocks,
    not round-robin (see ``TORCH_BLOCK``); ``n/a`` when torch is not importable.

    ``make_torch_step()`` builds the PyTorch step; with ``expected_loss`` its first loss must
    match it before anything is timed."""
    try:
        import torch

        tstep = make_torch_step()
        xt_, yt_ = torch.from_numpy(x), torch.from_numpy(y)
        if expected_loss is not None:
            l_t = tstep(xt_, yt_).item()
            assert abs(l_t - expected_loss) < 1e-4 * max(1.0, abs(expected_loss)), \
                (l_t, expected_loss)
        for _ in range(3):
            tstep(xt_, yt_)
        b = timing.compare({"eager": eager, "compiled": compiled,
                            "torch": lambda: tstep(xt_, yt_)},
                           rounds=max(1, repeats // (TORCH_BLOCK - TORCH_SETTLE)),
                           block=TORCH_BLOCK, discard=TORCH_SETTLE, warmup=0, stat="median")
    except ImportError:
        return f"{'n/a':>10}{'n/a':>13}{'n/a':>16}"
    return (f"{b['torch'] * 1e3:>10.3f}{b['eager'] / b['torch']:>12.2f}x"
            f"{b['compiled'] / b['torch']:>15.2f}x")


def model_row(name, build, forward, x_shape, repeats, rng):
    """One row for a model without a hand-written numpy step: eager, compiled and PyTorch."""
    x = rng.standard_normal(x_shape).astype(np.float32)
    y = rng.integers(0, 10, x_shape[0])
    model, opt = build()
    reference, _ = build()  # untouched weights for the compiled step and PyTorch
    xt, yt = ml.tensor(x), ml.tensor(y)
    l_ml = mlsys_step(*build(), xt, yt).item()
    step = ml.compile_train_step(build()[0], ops.cross_entropy, x, y, lr=LR)
    l_c = step(x, y)
    assert abs(l_c - l_ml) < 1e-4 * max(1.0, abs(l_ml)), (l_c, l_ml)
    t = timing.compare({"eager": lambda: mlsys_step(model, opt, xt, yt),
                        "compiled": lambda: step(x, y)},
                       rounds=repeats, warmup=3, stat="median")
    cols = (f"{'n/a':>10}{t['eager'] * 1e3:>10.3f}{t['compiled'] * 1e3:>12.3f}"
            f"{'n/a':>13}{'n/a':>16}")
    cols += torch_columns(lambda: mlsys_step(model, opt, xt, yt), lambda: step(x, y),
                          lambda: torch_model_step_fn(forward, reference), x, y, repeats,
                          expected_loss=l_ml)
    print(f"{name:<20}{x_shape[0]:>6}{cols}{'n/a':>10}{'n/a':>13}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--models", default="mlp,cnn,transformer",
                    help="comma-separated rows to run: mlp, cnn, transformer")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(chosen) - {"mlp", *MODELS})
    if unknown:
        ap.error(f"unknown models {unknown}; choose from mlp, {', '.join(MODELS)}")
    rng = np.random.default_rng(0)
    print(f"{'model':<20}{'batch':>6}{'numpy ms':>10}{'eager ms':>10}{'compiled ms':>12}"
          f"{'eager/numpy':>13}{'compiled/numpy':>16}{'torch ms':>10}{'eager/torch':>13}"
          f"{'compiled/torch':>16}{'GEMMs ms':>10}{'GEMMs/numpy':>13}")
    for sizes, batch in CONFIGS if "mlp" in chosen else ():
        mlp_row(sizes, batch, args.repeats, rng)
    for key in chosen:
        if key in MODELS:
            model_row(*MODELS[key], args.repeats, np.random.default_rng(1))


def mlp_row(sizes, batch, repeats, rng):
    """One MLP row: numpy, eager, compiled, PyTorch and the GEMMs alone."""
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch)
    params = make_params(sizes)
    np_params = [(w.copy(), b.copy()) for w, b in params]
    model, opt = build_mlsys(sizes, params)
    # Same starting point, same data: the two implementations must agree on the loss.
    l_np = numpy_step([(w.copy(), b.copy()) for w, b in params], x, y)
    l_ml = mlsys_step(*build_mlsys(sizes, params), ml.tensor(x), ml.tensor(y)).item()
    assert abs(l_np - l_ml) < 1e-4 * max(1.0, abs(l_np)), (l_np, l_ml)
    xt, yt = ml.tensor(x), ml.tensor(y)
    cmodel, _ = build_mlsys(sizes, params)
    step = ml.compile_train_step(cmodel, ops.cross_entropy, x, y, lr=LR)
    l_c = step(x, y)
    assert abs(l_c - l_np) < 1e-4 * max(1.0, abs(l_np)), (l_c, l_np)
    floor = gemm_floor_fn(params, x)
    # Round-robin, one call of each in turn, so that drifts in machine load hit all alike.
    t = timing.compare({"numpy": lambda: numpy_step(np_params, x, y),
                        "eager": lambda: mlsys_step(model, opt, xt, yt),
                        "compiled": lambda: step(x, y), "GEMMs": floor},
                       rounds=repeats, warmup=3, stat="median")
    t_np, t_ml, t_c, t_mm = t["numpy"], t["eager"], t["compiled"], t["GEMMs"]
    torch_cols = torch_columns(lambda: mlsys_step(model, opt, xt, yt), lambda: step(x, y),
                               lambda: torch_step_fn(params), x, y, repeats)
    name = "-".join(map(str, sizes))
    print(f"{name:<20}{batch:>6}{t_np * 1e3:>10.3f}{t_ml * 1e3:>10.3f}{t_c * 1e3:>12.3f}"
          f"{t_ml / t_np:>12.2f}x{t_c / t_np:>15.2f}x{torch_cols}"
          f"{t_mm * 1e3:>10.3f}{t_mm / t_np:>12.2f}x")


if __name__ == "__main__":
    main()
