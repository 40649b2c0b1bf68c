"""Cluster topologies: devices, links and routes.

Nodes ``0 .. p-1`` are the devices (node ``r`` runs rank ``r``); switches are further nodes. Every
link is full duplex: its two directions are separate resources, each with a latency ``alpha``
(seconds) and an inverse bandwidth ``beta`` (seconds per byte). A route is the tuple of link
directions a message crosses. Alone on its route, a message of ``n`` bytes on route ``R`` takes

    sum(alpha over R)  +  n * max(beta over R)

(cut-through: the bytes stream at the bottleneck's rate and the latencies of the hops add up);
how messages share links is the simulator's business (the rest of :mod:`mlsys_lab.distributed.sim`).

A device also has ``gamma``: seconds per byte to reduce (combine two arrays elementwise, the
third term of the alpha-beta-gamma cost model of Thakur, Rabenseifner and Gropp 2005). The
collectives charge it as compute time on the rank that combines; 0 (the default) makes
reductions free, as they were before the term existed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ...errors import ArgumentError


@dataclass(frozen=True)
class Device:
    """A compute device: ``flops`` (FLOP/s), ``memory`` (bytes) and ``gamma`` (seconds per
    byte a collective's reduction combines on it; 0: reductions are free)."""

    name: str
    flops: float
    memory: float
    gamma: float = 0.0


def _positive(value, what, where, allow_zero=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ArgumentError(f"{where}: {what}={value!r} must be a number "
                            f"{'>= 0' if allow_zero else '> 0'}")
    return float(value)


class Topology:
    """Devices, switches and full-duplex links, with a router.

    Args:
        p: number of devices (ranks).
        flops: FLOP/s of every device.
        memory: bytes of memory of every device.
        name: a label for printouts.
        gamma: seconds per byte every device takes to reduce (module docstring).
    """

    def __init__(self, p, flops=1e14, memory=80e9, name="custom", gamma=0.0):
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ArgumentError(f"{name}: p={p!r} must be an int >= 1")
        _positive(flops, "flops", name)
        _positive(memory, "memory", name)
        gamma = _positive(gamma, "gamma", name, allow_zero=True)
        self.name = name
        self.devices = [Device(f"dev{r}", float(flops), float(memory), gamma)
                        for r in range(p)]
        self.node_names = [f"dev{r}" for r in range(p)]
        self.link_ids: dict[tuple[int, int], int] = {}
        self.link_ends: list[tuple[int, int]] = []
        self.alpha: list[float] = []
        self.beta: list[float] = []
        self._adjacent: dict[int, list[int]] = {}
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}

    def __repr__(self):
        return (f"<{self.name} topology: {self.num_ranks} devices, "
                f"{len(self.node_names) - self.num_ranks} switches, "
                f"{len(self.link_ends)} link directions>")

    @property
    def num_ranks(self):
        return len(self.devices)

    # -- building ---------------------------------------------------------------------------
    def add_switch(self, name):
        """Add a switch node; returns its node id."""
        self.node_names.append(name)
        return len(self.node_names) - 1

    def add_link(self, u, v, alpha, beta):
        """Connect nodes ``u`` and ``v`` with a full-duplex link (two link directions)."""
        where = f"{self.name}.add_link({u}, {v})"
        alpha = _positive(alpha, "alpha", where, allow_zero=True)
        beta = _positive(beta, "beta", where, allow_zero=True)
        for a, b in ((u, v), (v, u)):
            if (a, b) in self.link_ids:
                raise ArgumentError(f"{where}: the link already exists")
            self.link_ids[(a, b)] = len(self.link_ends)
            self.link_ends.append((a, b))
            self.alpha.append(alpha)
            self.beta.append(beta)
            self._adjacent.setdefault(a, []).append(b)
        self._routes.clear()

    def link(self, u, v):
        """The id of the link direction ``u -> v``."""
        key = (u, v)
        if key not in self.link_ids:
            raise ArgumentError(f"{self.name}: there is no link {self._node(u)} -> "
                                f"{self._node(v)}")
        return self.link_ids[key]

    def link_name(self, link_id):
        u, v = self.link_ends[link_id]
        return f"{self._node(u)}->{self._node(v)}"

    def _node(self, n):
        return self.node_names[n] if 0 <= n < len(self.node_names) else str(n)

    def set_link(self, u, v, alpha=None, beta=None, both=True):
        """Change a link's ``alpha``/``beta`` (both directions unless ``both=False``)."""
        for a, b in ((u, v), (v, u)) if both else ((u, v),):
            i = self.link(a, b)
            if alpha is not None:
                self.alpha[i] = _positive(alpha, "alpha", "set_link", allow_zero=True)
            if beta is not None:
                self.beta[i] = _positive(beta, "beta", "set_link", allow_zero=True)

    def slow_link(self, u, v, factor, both=True):
        """Make a link ``factor`` times slower (its beta times ``factor``)."""
        _positive(factor, "factor", "slow_link")
        for a, b in ((u, v), (v, u)) if both else ((u, v),):
            i = self.link(a, b)
            self.beta[i] *= factor

    def set_device(self, rank, flops=None, memory=None, gamma=None):
        """Change one device (a straggler: ``flops`` lower than the rest, or a slower
        reduction: ``gamma`` higher)."""
        old = self.devices[rank]
        self.devices[rank] = Device(
            old.name, old.flops if flops is None else _positive(flops, "flops", "set_device"),
            old.memory if memory is None else _positive(memory, "memory", "set_device"),
            old.gamma if gamma is None else _positive(gamma, "gamma", "set_device", True))

    # -- routing ----------------------------------------------------------------------------
    def route(self, src, dst):
        """The link directions from device ``src`` to device ``dst`` (cached)."""
        key = (src, dst)
        found = self._routes.get(key)
        if found is None:
            direct = self.link_ids.get(key)
            found = (direct,) if direct is not None else tuple(self._find_route(src, dst))
            self._routes[key] = found
        return found

    def _find_route(self, src, dst):
        """Shortest path by hops (breadth first, lower node ids first)."""
        previous = {src: None}
        queue = deque([src])
        while queue:
            node = queue.popleft()
            if node == dst:
                break
            for nxt in sorted(self._adjacent.get(node, ())):
                if nxt not in previous:
                    previous[nxt] = node
                    queue.append(nxt)
        if dst not in previous:
            raise ArgumentError(f"{self.name}: no route from {self._node(src)} to "
                                f"{self._node(dst)}")
        path, node = [], dst
        while previous[node] is not None:
            path.append(self.link_ids[(previous[node], node)])
            node = previous[node]
        return path[::-1]

    def route_cost(self, route):
        """``(alpha, beta)`` of a route: latencies summed, the bottleneck's beta."""
        alpha = 0.0
        beta = 0.0
        for link in route:
            alpha = alpha + self.alpha[link]
            beta = max(beta, self.beta[link])
        return alpha, beta


class _FullyConnected(Topology):
    """Every pair of devices has its own link (created when first used)."""

    def __init__(self, p, alpha, beta, **kwargs):
        super().__init__(p, name="fully_connected", **kwargs)
        self._default = (_positive(alpha, "alpha", "fully_connected", True),
                         _positive(beta, "beta", "fully_connected", True))

    def link(self, u, v):
        devices = range(self.num_ranks)
        if (u, v) not in self.link_ids and u != v and u in devices and v in devices:
            self.add_link(u, v, *self._default)
        return super().link(u, v)

    def route(self, src, dst):
        return (self.link(src, dst),)


class _Ring(Topology):
    """Device ``r`` linked to ``r + 1 (mod p)``; other pairs go the shorter way round."""

    def route(self, src, dst):
        key = (src, dst)
        found = self._routes.get(key)
        if found is None:
            p = self.num_ranks
            step = 1 if (dst - src) % p <= (src - dst) % p else -1
            hops, node = [], src
            while node != dst:
                nxt = (node + step) % p
                hops.append(self.link(node, nxt))
                node = nxt
            found = self._routes[key] = tuple(hops)
        return found


class _Tree(Topology):
    """Devices at the leaves of a switch tree; messages go up to the common ancestor."""

    def route(self, src, dst):
        key = (src, dst)
        found = self._routes.get(key)
        if found is None:
            up, down = [src], [dst]
            while up[-1] != down[-1]:
                a, b = up[-1], down[-1]
                if self._depth[a] <= self._depth[b]:  # climb the lower side (both if level)
                    up.append(self._parent[a])
                if self._depth[b] <= self._depth[a]:
                    down.append(self._parent[b])
            path = up + down[-2::-1]
            found = self._routes[key] = tuple(self.link(a, b) for a, b in zip(path, path[1:]))
        return found


def ring(p, alpha=5e-6, beta=1 / 25e9, flops=1e14, memory=80e9, gamma=0.0):
    """``p`` devices in a ring, neighbours joined by one full-duplex link each (``gamma``:
    the devices' seconds per byte reduced, module docstring)."""
    topo = _Ring(p, flops=flops, memory=memory, name="ring", gamma=gamma)
    for r in range(p if p > 2 else p - 1):
        topo.add_link(r, (r + 1) % p, alpha, beta)
    return topo


def fully_connected(p, alpha=5e-6, beta=1 / 25e9, flops=1e14, memory=80e9, gamma=0.0):
    """``p`` devices, every pair joined by its own full-duplex link (``gamma``: the devices'
    seconds per byte reduced, module docstring)."""
    return _FullyConnected(p, alpha, beta, flops=flops, memory=memory, gamma=gamma)


def tree(p, fanout=2, alpha=5e-6, beta=1 / 25e9, fat=1.0, flops=1e14, memory=80e9,
         gamma=0.0):
    """Devices under a tree of switches, ``fanout`` children per switch.

    A link ``k`` levels above the devices has bandwidth ``fat ** k`` times the devices' own
    (``fat=1``: every link alike, so the upper links are where messages contend;
    ``fat=fanout``: a full-bisection fat tree). A route's alpha sums ``alpha`` per hop.
    ``gamma``: the devices' seconds per byte reduced (module docstring).
    """
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 2:
        raise ArgumentError(f"tree: fanout={fanout!r} must be an int >= 2")
    _positive(fat, "fat", "tree")
    topo = _Tree(p, flops=flops, memory=memory, name="tree", gamma=gamma)
    topo._parent, topo._depth = {}, {r: 0 for r in range(p)}
    level, depth = list(range(p)), 0
    while len(level) > 1:
        depth += 1
        upper = []
        for start in range(0, len(level), fanout):
            switch = topo.add_switch(f"sw{depth}.{start // fanout}")
            topo._depth[switch] = depth
            upper.append(switch)
            for child in level[start:start + fanout]:
                topo._parent[child] = switch
                topo.add_link(child, switch, alpha, beta / fat ** (depth - 1))
        level = upper
    for node in level:
        topo._parent.setdefault(node, None)
    return topo


class _TwoLevel(Topology):
    def route(self, src, dst):
        key = (src, dst)
        found = self._routes.get(key)
        if found is None:
            g = self._gpus_per_server
            if src // g == dst // g:
                hub = self._nvswitch[src // g]
                path = [src, hub, dst]
            else:
                tor_a, tor_b = self._tor_of[src // g], self._tor_of[dst // g]
                middle = [tor_a] if tor_a == tor_b else [tor_a, self._spine, tor_b]
                path = [src, *middle, dst]
            found = self._routes[key] = tuple(self.link(a, b) for a, b in zip(path, path[1:]))
        return found


def two_level(servers, gpus_per_server, nvlink_alpha=2e-6, nvlink_beta=1 / 300e9,
              ib_alpha=5e-6, ib_beta=1 / 25e9, servers_per_tor=None, oversubscription=1.0,
              flops=1e14, memory=80e9, gamma=0.0):
    """Servers of GPUs: NVLink inside a server, InfiniBand between servers.

    Inside a server every GPU links to the server's NVSwitch (GPU to GPU: ``nvlink_alpha`` in
    all, ``nvlink_beta`` per byte). Every GPU also has its own NIC link to its server's
    top-of-rack switch (ToR; ``ib_beta`` per byte). ``servers_per_tor`` servers share a ToR
    (default: all, so there is no spine); ToRs join one spine switch, each by an uplink of
    ``downlinks * ib_bandwidth / oversubscription`` (``oversubscription=4`` is 1:4). A route
    across servers costs ``ib_alpha`` of latency wherever it goes. ``gamma``: the GPUs'
    seconds per byte reduced (module docstring).
    """
    where = "two_level"
    for value, what in ((servers, "servers"), (gpus_per_server, "gpus_per_server")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{where}: {what}={value!r} must be an int >= 1")
    per_tor = servers if servers_per_tor is None else servers_per_tor
    if isinstance(per_tor, bool) or not isinstance(per_tor, int) or per_tor < 1:
        raise ArgumentError(f"{where}: servers_per_tor={servers_per_tor!r} must be an int >= 1")
    _positive(oversubscription, "oversubscription", where)
    ib_beta = _positive(ib_beta, "ib_beta", where, allow_zero=True)
    g = gpus_per_server
    topo = _TwoLevel(servers * g, flops=flops, memory=memory, name="two_level", gamma=gamma)
    topo._gpus_per_server = g
    topo._nvswitch = [topo.add_switch(f"nvswitch{s}") for s in range(servers)]
    tors = [topo.add_switch(f"tor{t}") for t in range(-(-servers // per_tor))]
    topo._tor_of = [tors[s // per_tor] for s in range(servers)]
    for s in range(servers):
        for local in range(g):
            gpu = s * g + local
            topo.add_link(gpu, topo._nvswitch[s], nvlink_alpha / 2, nvlink_beta)
            topo.add_link(gpu, topo._tor_of[s], ib_alpha / 2, ib_beta)
    topo._spine = None
    if len(tors) > 1:
        topo._spine = topo.add_switch("spine")
        uplink_beta = ib_beta * oversubscription / (per_tor * g)
        for tor in tors:
            topo.add_link(tor, topo._spine, 0.0, uplink_beta)
    return topo
