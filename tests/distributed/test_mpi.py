"""The MPI backend: the collectives' own generator code over real processes (mpiexec -n 2 and
-n 4 on this machine) against MPI's routines, point-to-point, timeouts and the command line."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mpi4py")

TIMEOUT = 60

SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    from mpi4py import MPI
    from mlsys_lab.distributed import mpi, collectives as coll
    from mlsys_lab.distributed.comm import CommTimeoutError
    from mlsys_lab.errors import ArgumentError

    c = MPI.COMM_WORLD
    r, p = c.rank, c.size
    comm = mpi.world(timeout=20)
    rng = np.random.default_rng(100 + r)

    def run(fn, *args, **kw):
        return mpi.run(lambda cm: (yield from fn(cm, *args, **kw)), comm=comm)

    def same(a, b, what):
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b):
            print(f"rank {r}: {what}: {a!r} != {b!r}", flush=True)
            c.Abort(3)

    for n in (0, 1, p + 1, 1000):
        x = rng.integers(-1000, 1000, n).astype(np.int64)
        ref = np.empty_like(x)
        c.Allreduce(x, ref)
        for algo in coll.ALGORITHMS["allreduce"]:
            same(run(coll.allreduce, x, algo=algo, segments=2), ref, f"allreduce {algo} {n}")
        mx = np.empty_like(x)
        c.Allreduce(x, mx, op=MPI.MAX)
        same(run(coll.allreduce, x, op="max"), mx, "allreduce max")
        counts = [b - a for a, b in coll.block_bounds(n, p)]
        block = np.empty(counts[r], np.int64)
        c.Reduce_scatter(x, block, recvcounts=counts)
        for algo in coll.ALGORITHMS["reduce_scatter"]:
            if algo == "ring" or p & (p - 1) == 0:
                same(run(coll.reduce_scatter, x, algo=algo), block, f"reduce_scatter {algo}")
        gathered = np.empty(n * p, np.int64)
        c.Allgather(x, gathered)
        for algo in coll.ALGORITHMS["allgather"]:
            if algo == "ring" or p & (p - 1) == 0:
                same(run(coll.allgather, x, algo=algo), gathered, f"allgather {algo}")
        for algo in coll.ALGORITHMS["broadcast"]:
            ref_b = x.copy()
            c.Bcast(ref_b, root=p - 1)
            same(run(coll.broadcast, x, root=p - 1, algo=algo), ref_b, f"broadcast {algo}")
        for algo in coll.ALGORITHMS["reduce"]:
            red = np.empty_like(x)
            c.Reduce(x, red, root=1)
            out = run(coll.reduce, x, root=1, algo=algo)
            if r == 1:
                same(out, red, f"reduce {algo}")
        for algo in coll.ALGORITHMS["gather"]:
            gat = np.empty(n * p, np.int64) if r == 0 else None
            c.Gather(x, gat, root=0)
            out = run(coll.gather, x, root=0, algo=algo)
            if r == 0:
                same(out, gat, f"gather {algo}")
        xa = rng.integers(-9, 9, 3 * p).astype(np.int64)
        a2a = np.empty_like(xa)
        c.Alltoall(xa, a2a)
        for algo in coll.ALGORITHMS["alltoall"]:
            same(run(coll.alltoall, xa, algo=algo), a2a, f"alltoall {algo}")

    xf = rng.standard_normal(4097)
    ref = np.empty_like(xf)
    c.Allreduce(xf, ref)
    for algo in coll.ALGORITHMS["allreduce"]:
        got = run(coll.allreduce, xf, algo=algo)
        if not np.allclose(got, ref, rtol=1e-12, atol=1e-12):
            print(f"rank {r}: float allreduce {algo} differs", flush=True)
            c.Abort(3)

    # a sub-communicator (the evens, the odds) matches MPI's Split
    members = [q for q in range(p) if q % 2 == r % 2]
    x = np.full(5, r + 1, np.int64)
    part = np.empty_like(x)
    c.Split(r % 2, r).Allreduce(x, part)
    sub = comm.sub(members)
    same(mpi.run(lambda cm: (yield from coll.allreduce(cm, x)), comm=sub), part, "sub")

    # point to point: eager send, tags, exchange, out=
    def p2p(cm):
        right, left = (cm.rank + 1) % cm.size, (cm.rank - 1) % cm.size
        yield cm.send(np.arange(3) + cm.rank, right, tag=7)
        yield cm.send(np.array([cm.rank]), right, tag=8)
        late = yield cm.recv(left, tag=8)
        early = yield cm.recv(left, tag=7, out=np.zeros(3, dtype=np.int64))
        got = yield cm.exchange([(np.array([1.5 * cm.rank]), right)], [left])
        yield cm.compute(flops=1e9)
        return late, early, got[0], cm.now()

    late, early, got, now = mpi.run(p2p, comm=comm)
    same(late, np.array([(r - 1) % p]), "tag order")
    same(early, np.arange(3) + (r - 1) % p, "out=")
    same(got, np.array([1.5 * ((r - 1) % p)]), "exchange")
    assert now > 0

    # any-source receive: rank 0 hears from every other rank, in whatever order, with sources
    def anysrc(cm):
        if cm.rank != 0:
            yield cm.send(np.array([10 * cm.rank, cm.rank]), 0, tag=3)
            return None
        heard = {}
        for _ in range(cm.size - 1):
            src, msg = yield cm.recv_any(tag=3)
            heard[src] = msg
        return heard

    heard = mpi.run(anysrc, comm=comm)
    if r == 0:
        assert sorted(heard) == list(range(1, p)), heard
        for q, msg in heard.items():
            same(msg, np.array([10 * q, q]), "recv_any")

    # a background task on a dup'd communicator: same values under MPI (run at start)
    def background(cm):
        stream = cm.dup()
        task = yield cm.start(coll.allreduce(stream, np.full(3, cm.rank + 1.0)))
        return (yield cm.wait(task))

    same(mpi.run(background, comm=comm), np.full(3, p * (p + 1) / 2), "start/wait")

    # errors: a bad rank is refused before any MPI call; a receive nobody answers times out
    try:
        mpi.run(lambda cm: (yield cm.send(np.ones(1), p)), comm=comm)
        c.Abort(4)
    except ArgumentError:
        pass
    quick = mpi.MpiCommunicator(c, timeout=0.3)
    try:
        mpi.run(lambda cm: (yield cm.recv((r + 1) % p, tag=29999)), comm=quick)
        c.Abort(5)
    except CommTimeoutError as exc:
        assert f"rank {r}" in str(exc) and "recv" in str(exc)
    c.Barrier()
    if r == 0:
        print("ALL OK", p, flush=True)
''')


def mpiexec():
    from mlsys_lab.distributed.mpi import find_mpiexec

    found = find_mpiexec()
    if found is None:
        pytest.fail("mpi4py is installed but mpiexec is not (pip install mpich mpi4py)")
    return found


def launch(n, args, cwd):
    """``mpiexec -n n python ARGS`` on this machine only, killed (whole group) on timeout."""
    env = dict(os.environ)
    cmd = [mpiexec(), "-n", str(n), "-launcher", "fork", "-hosts", "localhost",
           sys.executable, *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"mpiexec -n {n} ran past {TIMEOUT} s:\n{out}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_over_mpi_equal_mpis_own(n, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(SCRIPT)
    code, out = launch(n, [str(script)], tmp_path)
    assert code == 0 and f"ALL OK {n}" in out, out


def test_command_line_prints_correctness_and_bus_bandwidth(tmp_path):
    code, out = launch(2, ["-m", "mlsys_lab.distributed.mpi", "allreduce", "--algo", "ring",
                           "--bytes", "256K", "--iters", "2"], tmp_path)
    assert code == 0, out
    assert "allreduce algo=ring p=2 bytes=262144" in out and "OK" in out
    assert "busbw" in out and "algbw" in out and "MPI" in out


# --- MPI against the simulator: shapes and dtypes round-trip, and both ways to ask ------------
AGAINST_SIM = textwrap.dedent('''
    import sys
    import numpy as np
    from mpi4py import MPI
    from mlsys_lab.distributed import mpi, sim, collectives as coll

    c = MPI.COMM_WORLD
    r, p = c.rank, c.size
    comm = mpi.world(timeout=10)
    cluster = sim.Cluster(sim.fully_connected(p))
    failures = []

    def same(a, b):
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and \\
                all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, np.ndarray):
            return isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype \\
                and np.array_equal(a, b)
        return a == b

    def check(name, prog, inputs):
        """prog(comm, inputs[rank]) under MPI gives what the simulator gives this rank."""
        want = sim.run(cluster, prog, args=[(x,) for x in inputs]).results[r]
        try:
            got = mpi.run(prog, inputs[r], comm=comm)
        except Exception as exc:  # a failure on one rank must not hide the others
            got = f"{type(exc).__name__}: {exc}"
        if not same(got, want):
            failures.append(f"{name}: MPI {got!r} but the simulator {want!r}")

    def shapes():
        for dtype in ("float64", "int32"):
            xs = [np.array(q + 1, dtype) for q in range(p)]  # 0-d on every rank
            for algo in coll.ALGORITHMS["allreduce"]:
                for op in ("sum", "max"):
                    check(f"allreduce {algo} {op} {dtype}",
                          lambda cm, x: (yield from coll.allreduce(cm, x, op=op, algo=algo,
                                                                   segments=2)), xs)
            for algo in coll.ALGORITHMS["reduce"]:
                check(f"reduce {algo} {dtype}",
                      lambda cm, x: (yield from coll.reduce(cm, x, root=p - 1, algo=algo)), xs)
            for algo in coll.ALGORITHMS["broadcast"]:
                given = xs if algo == "scatter_allgather" else \\
                    [x if q == p - 1 else None for q, x in enumerate(xs)]
                for segments in (1, 2):
                    check(f"broadcast {algo} segments={segments} {dtype}",
                          lambda cm, x: (yield from coll.broadcast(
                              cm, x, root=p - 1, algo=algo, segments=segments)), given)
            pow2 = p & (p - 1) == 0
            for algo in coll.ALGORITHMS["reduce_scatter"]:
                if algo == "ring" or pow2:
                    check(f"reduce_scatter {algo} {dtype}",
                          lambda cm, x: (yield from coll.reduce_scatter(cm, x, algo=algo)), xs)
            for algo in coll.ALGORITHMS["allgather"]:
                if algo == "ring" or pow2:
                    check(f"allgather {algo} {dtype}",
                          lambda cm, x: (yield from coll.allgather(cm, x, algo=algo)), xs)
            for algo in coll.ALGORITHMS["gather"]:
                check(f"gather {algo} {dtype}",
                      lambda cm, x: (yield from coll.gather(cm, x, root=1, algo=algo)), xs)
            check(f"scatter direct {dtype}",
                  lambda cm, x: (yield from coll.scatter(cm, x, root=0, algo="direct")),
                  [xs[0]] + [None] * (p - 1))
            for algo in coll.ALGORITHMS["alltoall"]:
                check(f"alltoall {algo} {dtype}",
                      lambda cm, x: (yield from coll.alltoall(cm, x, algo=algo)), xs)
        # point to point: every dtype and layout arrives as it left
        arrays = [np.array(True), np.array(-3, np.int8), np.array(7, np.uint16),
                  np.array(1.5, np.float16), np.array(2.25, np.float32),
                  np.array(1 + 2j), np.array(5, ">i4"), np.array(3, "datetime64[s]"),
                  np.arange(6.0).reshape(2, 3), np.asfortranarray(np.arange(6).reshape(2, 3)),
                  np.arange(10)[::3], np.zeros((0, 3), np.float32), np.ones((1, 1, 1), bool)]

        def p2p(cm, _):
            right, left = (cm.rank + 1) % cm.size, (cm.rank - 1) % cm.size
            got = []
            for i, a in enumerate(arrays):
                yield cm.send(a, right, tag=i)
                got.append((yield cm.recv(left, tag=i)))
                got.append((yield cm.sendrecv(a, right, left)))
                got += (yield cm.exchange([(a, right)], [left]))
                buf = np.empty(a.shape, a.dtype)
                yield cm.send(a, right, tag=i)
                got.append((yield cm.recv(left, tag=i, out=buf)))
            if cm.rank:
                yield cm.send(arrays[cm.rank], 0, tag=99)
                return got
            for _ in range(cm.size - 1):
                src, msg = yield cm.recv_any(tag=99)
                got.append((src, msg.shape, msg.dtype.str))
            got[-cm.size + 1:] = sorted(got[-cm.size + 1:])
            return got

        check("point to point", p2p, [None] * p)

    def requests():
        import importlib.util
        spec = importlib.util.spec_from_file_location("dist_sim", sys.argv[2])
        every_request = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(every_request)
        for from_form in (False, True):
            def prog(cm, f):
                got = yield from every_request.every_request(cm, f)
                return {k: v for k, v in got.items()}
            check(f"every request, yield from={from_form}", prog, [from_form] * p)

    {"shapes": shapes, "requests": requests}[sys.argv[1]]()
    for line in failures:
        print(f"rank {r}: {line}", flush=True)
    if c.allreduce(len(failures)) == 0 and r == 0:
        print("ALL OK", p, flush=True)
''')


@pytest.mark.parametrize("n", [3, 4])
def test_mpi_keeps_0d_shapes_and_dtypes_like_the_simulator(n, tmp_path):
    """Under MPI a 0-d array arrived as shape (1,) (np.ascontiguousarray): broadcast gave (1,)
    off the root and the binomial reduce raised ShapeError. Every collective on 0-d inputs
    and every dtype and layout point to point now gives exactly the simulator's result."""
    script = tmp_path / "against_sim.py"
    script.write_text(AGAINST_SIM)
    code, out = launch(n, [str(script), "shapes"], tmp_path)
    assert code == 0 and f"ALL OK {n}" in out, out


def test_mpi_requests_work_with_yield_and_yield_from(tmp_path):
    """Every request kind (send, recv, recv_any, sendrecv, exchange, compute, start, wait,
    batched, on a sub-communicator) asked with ``yield from`` under MPI gives what the
    simulator gives, as with ``yield`` (tests/distributed/test_dist_sim.py's ``every_request``)."""
    script = tmp_path / "against_sim.py"
    script.write_text(AGAINST_SIM)
    program = os.path.join(os.path.dirname(__file__), "test_dist_sim.py")
    code, out = launch(3, [str(script), "requests", program], tmp_path)
    assert code == 0 and "ALL OK 3" in out, out
