"""Minimal pytrees: flatten nested tuples/lists/dicts of leaves and rebuild them."""


def flatten(tree):
    """Return (leaves, treedef). Containers: tuple, list, dict (keys sorted); all else is a leaf."""
    leaves = []

    def go(x):
        if isinstance(x, (tuple, list)):
            return (type(x), [go(c) for c in x])
        if isinstance(x, dict):
            keys = sorted(x)
            return (dict, keys, [go(x[k]) for k in keys])
        leaves.append(x)
        return None

    return leaves, go(tree)


def unflatten(treedef, leaves):
    """Inverse of :func:`flatten`."""
    it = iter(leaves)

    def go(d):
        if d is None:
            return next(it)
        if d[0] is dict:
            return {k: go(c) for k, c in zip(d[1], d[2])}
        return d[0](go(c) for c in d[1])

    return go(treedef)
