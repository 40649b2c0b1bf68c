"""The trees of the tree algorithms: NCCL-style binary and double binary trees, the binomial
tree of the rooted collectives, and the pipelined tree all-reduce."""

from __future__ import annotations

from .common import TAG, TAG_B, block_bounds, charge, combine, concat, exchange


def _btree(p):
    """NCCL-style in-order binary tree over ranks ``0..p-1``: ``(parent, children, root)``.

    Label ``x = rank + 1``; a label with lowest set bit ``b`` has children ``x - b/2`` and
    ``x + b/2`` (the latter walked down while it is past ``p``). Leaves are the even ranks."""
    parent, children = [None] * p, [[] for _ in range(p)]
    root = 1 << (p.bit_length() - 1)
    stack = [root]
    while stack:
        x = stack.pop()
        b = x & -x
        if b == 1:
            continue
        kids = [x - b // 2]
        right = x + b // 2
        while right > p and (right & -right) > 1:
            right -= (right & -right) // 2
        if right <= p:
            kids.append(right)
        for kid in kids:
            parent[kid - 1] = x - 1
            children[x - 1].append(kid - 1)
            stack.append(kid)
    return parent, children, root - 1


def complementary_trees(p, count):
    """One tree, or two complementary ones (mirrored for even ``p``, shifted for odd)."""
    parent, children, root = _btree(p)
    trees = [(parent, children, root)]
    if count == 2:
        role = (lambda r: p - 1 - r) if p % 2 == 0 else (lambda r: (r - 1) % p)
        inverse = {role(r): r for r in range(p)}
        parent_b = [None] * p
        children_b = [[] for _ in range(p)]
        for r in range(p):
            pa = parent[role(r)]
            parent_b[r] = None if pa is None else inverse[pa]
            children_b[r] = [inverse[c] for c in children[role(r)]]
        trees.append((parent_b, children_b, inverse[root]))
    return trees


def _levels(parent, children, root):
    """Height (leaves 0) and depth (root 0) of every node of a tree."""
    p = len(parent)
    depth, order, stack = [0] * p, [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        for kid in children[node]:
            depth[kid] = depth[node] + 1
            stack.append(kid)
    height = [0] * p
    for node in reversed(order):
        if children[node]:
            height[node] = 1 + max(height[k] for k in children[node])
    return height, depth


def binomial_tree(p):
    """The binomial tree of the rooted collectives over relative ranks ``0..p-1`` (root 0):
    ``(parent, children, span)``. ``v``'s parent is ``v`` minus its lowest set bit; its
    children are ``v + 1, v + 2, v + 4, ...`` below that bit (and below ``p``), smallest
    first; ``span[v]`` is the size of ``v``'s subtree, the relative ranks ``v .. v+span-1``."""
    parent, children, span = [None] * p, [[] for _ in range(p)], [0] * p
    for v in range(p):
        low = v & -v if v else 1 << max(p - 1, 0).bit_length()
        span[v] = min(low, p - v)
        mask = 1
        while mask < low and v + mask < p:
            children[v].append(v + mask)
            parent[v + mask] = v
            mask <<= 1
    return parent, children, span


def tree_links(p, algo="tree"):
    """The trees of ``algo`` over ``p`` ranks, for cost formulas, pictures and the rooted
    collectives' walks: ``[(parent, children, root, height, depth)]`` per tree. ``tree`` and
    ``double_tree``: the all-reduce's binary trees; ``binomial``: :func:`binomial_tree`
    (relative ranks, root 0)."""
    if algo == "binomial":
        parent, children, _ = binomial_tree(p)
        return [(parent, children, 0, *_levels(parent, children, 0))]
    return [(pa, ch, root, *_levels(pa, ch, root))
            for pa, ch, root in complementary_trees(p, 2 if algo == "double_tree" else 1)]


def tree_allreduce(comm, flat, fn, trees, segments, where):
    """Pipelined tree reduce, then broadcast. A node of height ``h`` sends segment ``j`` up in
    step ``j + h`` and receives it from its children in step ``j + h - 1``; going down, a node
    of depth ``d`` receives segment ``j`` in step ``j + d - 1`` and passes it on in step
    ``j + d``. Every wait is on an earlier step, so the steps never deadlock, and with two
    trees (each carrying half the data) one ``exchange`` per step serves both."""
    r, k = comm.rank, segments
    levels = [(pa, ch, *_levels(pa, ch, root)) for pa, ch, root in trees]
    pieces = []  # per tree: the segments of this rank's share of the data
    for a, b in block_bounds(flat.shape[0], len(trees)):
        pieces.append([flat[a + s:a + e] for s, e in block_bounds(b - a, k)])
    tags = [TAG, TAG_B]
    up_steps = k - 1 + max(max(h) for _, _, h, _ in levels)
    for g in range(up_steps):
        sends, srcs, slots = [], [], []
        for t, (parent, children, height, _) in enumerate(levels):
            h = height[r]
            if parent[r] is not None and 0 <= g - h < k:
                sends.append((pieces[t][g - h], parent[r], tags[t]))
            if 0 <= g - h + 1 < k:
                srcs += [(c, tags[t]) for c in children[r]]
                slots += [(t, g - h + 1)] * len(children[r])
        got = yield exchange(comm, sends, srcs)
        for (src, _), (t, j), value in zip(srcs, slots, got):
            pieces[t][j] = combine(fn, value, pieces[t][j], where, comm, src)
        yield from charge(comm, sum(pieces[t][j].nbytes for t, j in slots))
    down_steps = k - 1 + max(max(d) for _, _, _, d in levels)
    for g in range(down_steps):
        sends, srcs, slots = [], [], []
        for t, (parent, children, _, depth) in enumerate(levels):
            d = depth[r]
            if 0 <= g - d < k:
                sends += [(pieces[t][g - d], c, tags[t]) for c in children[r]]
            if parent[r] is not None and 0 <= g - d + 1 < k:
                srcs.append((parent[r], tags[t]))
                slots.append((t, g - d + 1))
        got = yield exchange(comm, sends, srcs)
        for (t, j), value in zip(slots, got):
            pieces[t][j] = value
    return concat([seg for piece in pieces for seg in piece])
