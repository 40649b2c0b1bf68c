"""Independent float64 numpy references for the federated tests: a two-layer MLP's loss and
gradient by hand (no engine), and plain minibatch SGD with an optional proximal term."""

import numpy as np


def grads(params, x, y):
    """Mean cross-entropy gradient of relu(x W1 + b1) W2 + b2 by hand."""
    h_pre = x @ params["W1"] + params["b1"]
    h = np.maximum(h_pre, 0.0)
    z = h @ params["W2"] + params["b2"]
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    dz = (p - np.eye(z.shape[1])[y]) / len(y)
    dh = (dz @ params["W2"].T) * (h_pre > 0)
    return {"W1": x.T @ dh, "b1": dh.sum(0), "W2": h.T @ dz, "b2": dz.sum(0)}


def per_example_grads(params, x, y):
    return [grads(params, x[i:i + 1], y[i:i + 1]) for i in range(len(y))]


def sgd(params, x, y, orders, batch_size, lr, mu=0.0):
    """Minibatch SGD over the given epoch orders (lists of row indices)."""
    w = {k: v.copy() for k, v in params.items()}
    for order in orders:
        for s in range(0, len(order), batch_size):
            rows = order[s:s + batch_size]
            g = grads(w, x[rows], y[rows])
            w = {k: w[k] - lr * (g[k] + mu * (w[k] - params[k])) for k in w}
    return w
