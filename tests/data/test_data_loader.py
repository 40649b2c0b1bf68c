"""DataLoader behaviour with and without worker processes: what is delivered, in which order,
seeding, prefetch bounds, persistent workers, shared memory, start methods, resuming, and
forking after numba's and BLAS's thread pools started.

Small datasets and few hypothesis examples: every example with workers forks processes.
"""

import multiprocessing
import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.data import (
    DataLoader,
    DataLoaderError,
    Dataset,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
    get_worker_info,
)
from mlsys_lab.data.loader import shm

FEW = settings(max_examples=25, deadline=None)


class Indexed(Dataset):
    """Sample i is {"index": i, "x": a row filled with i} (``width`` floats)."""

    def __init__(self, n, width=4):
        self.n, self.width = n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"index": i, "x": np.full(self.width, i, np.float32)}


class Sharded(IterableDataset):
    """range(n), each worker taking every num_workers-th item from its id."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield {"index": i, "x": np.full(4, i, np.float32)}


class Unsharded(IterableDataset):
    def __iter__(self):
        return iter(range(5))


class WhoAmI(Dataset):
    """Reports the worker's pid, info and random draws."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {"pid": os.getpid(), "id": -1 if info is None else info.id,
                "seed": -1 if info is None else info.seed,
                "np": np.random.randint(0, 2**31), "py": random.randrange(2**31),
                "tag": getattr(info.dataset if info else self, "tag", "")}


def delivered(loader):
    return [b["index"].tolist() for b in loader]


def expected_chunks(order, batch, drop_last):
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    if drop_last and chunks and len(chunks[-1]) < batch:
        chunks.pop()
    return chunks


@FEW
@given(n=st.integers(0, 23), batch=st.integers(1, 6), workers=st.integers(0, 2),
       drop_last=st.booleans(), shuffle=st.booleans(), in_order=st.booleans(),
       replicas=st.integers(1, 3), data=st.data())
def test_map_style_delivery_invariant(n, batch, workers, drop_last, shuffle, in_order, replicas,
                                      data):
    rank = data.draw(st.integers(0, replicas - 1))
    extra = {} if workers == 0 else {"in_order": in_order}
    if replicas > 1:
        sampler = DistributedSampler(range(n), replicas, rank, shuffle=shuffle, seed=3)
        order = list(sampler)
        loader = DataLoader(Indexed(n), batch, sampler=sampler, num_workers=workers,
                            drop_last=drop_last, **extra)
    else:
        def make():
            return DataLoader(Indexed(n), batch, shuffle=shuffle, num_workers=workers,
                              drop_last=drop_last, seed=5, **extra)
        loader, order = make(), list(make().sampler)  # seeded: a twin's sampler, same order
    got = delivered(loader)
    chunks = expected_chunks(order, batch, drop_last)
    assert len(got) == len(loader) == len(chunks)
    if workers == 0 or in_order:
        assert got == chunks
    else:
        assert sorted(map(tuple, got)) == sorted(map(tuple, chunks))
    flat = [i for b in got for i in b]
    if not drop_last:
        assert sorted(flat) == sorted(order)  # every index of the epoch exactly once
    else:
        assert len(flat) == len(order) // batch * batch and all(len(b) == batch for b in got)
        assert sorted(flat + order[len(flat):]) == sorted(order)  # only the tail is missing


@FEW
@given(n=st.integers(0, 23), batch=st.integers(1, 6), workers=st.integers(0, 3),
       drop_last=st.booleans(), in_order=st.booleans())
def test_iterable_delivery_invariant(n, batch, workers, drop_last, in_order):
    extra = {} if workers == 0 else {"in_order": in_order}
    got = delivered(DataLoader(Sharded(n), batch, num_workers=workers, drop_last=drop_last,
                               **extra))
    streams = [list(range(w, n, max(workers, 1))) for w in range(max(workers, 1))]
    per_worker = [expected_chunks(s, batch, drop_last) for s in streams]
    assert sorted(map(tuple, got)) == sorted(tuple(c) for chunks in per_worker for c in chunks)
    if workers <= 1 or in_order:  # round robin over the workers that still have data
        expected, k = [], 0
        while any(per_worker):
            if per_worker[k % len(per_worker)]:
                expected.append(per_worker[k % len(per_worker)].pop(0))
            k += 1
        assert got == expected
    flat = [i for b in got for i in b]
    assert len(set(flat)) == len(flat)  # never duplicated
    if not drop_last:
        assert sorted(flat) == list(range(n))


def test_len_counts_batches_as_pytorch():
    assert len(DataLoader(Indexed(10), 3)) == 4 and len(DataLoader(Indexed(10), 3,
                                                                   drop_last=True)) == 3
    assert len(DataLoader(Sharded(10), 3)) == 4 and len(DataLoader(Sharded(10), None)) == 10
    assert len(DataLoader(Indexed(0), 3)) == 0


def test_unsharded_iterable_is_copied_into_each_worker():
    got = sorted(int(v) for b in DataLoader(Unsharded(), batch_size=None, num_workers=2)
                 for v in np.atleast_1d(b))
    assert got == sorted(list(range(5)) * 2)  # documented, as in PyTorch


def test_shuffle_order_is_seeded_and_changes_per_epoch():
    def epochs(seed, workers):
        loader = DataLoader(Indexed(30), 4, shuffle=True, seed=seed, num_workers=workers)
        return delivered(loader), delivered(loader)
    first, second = epochs(1, 2)
    assert first == epochs(1, 0)[0] and second == epochs(1, 0)[1]  # same seed, same order
    assert first != second  # a new order each epoch
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(30))
    assert epochs(2, 0)[0] != first
    sampler = DistributedSampler(range(30), 2, 0, seed=4)
    loader = DataLoader(Indexed(30), 4, sampler=sampler)
    sampler.set_epoch(0)
    e0 = delivered(loader)
    sampler.set_epoch(1)
    assert delivered(loader) != e0


class Gated(Dataset):
    """Sample 0 waits until ``gate`` is set (by the consumer)."""

    def __init__(self, gate):
        self.gate = gate

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 0:
            self.gate.wait(10)
        return {"index": i}


def test_in_order_false_delivers_what_is_ready_first():
    gate = multiprocessing.get_context("fork").Event()
    loose = iter(DataLoader(Gated(gate), 2, num_workers=2, in_order=False))
    first = next(loose)["index"].tolist()
    assert first != [0, 1]  # batch 0 cannot be ready before the consumer opens the gate
    gate.set()
    rest = [b["index"].tolist() for b in loose]
    expected = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert sorted([first, *rest]) == expected
    assert delivered(DataLoader(Gated(gate), 2, num_workers=2)) == expected  # in order


class Counting(Dataset):
    def __init__(self, counter):
        self.counter = counter

    def __len__(self):
        return 40

    def __getitem__(self, i):
        with self.counter.get_lock():
            self.counter.value += 1
        return i


@pytest.mark.parametrize("prefetch", [1, 3])
def test_at_most_prefetch_factor_batches_in_flight_per_worker(prefetch):
    counter = multiprocessing.get_context("fork").Value("i", 0)
    loader = DataLoader(Counting(counter), batch_size=1, num_workers=2, prefetch_factor=prefetch)
    def settled(at_least):  # wait until the workers reach ``at_least`` fetches, then a bit
        deadline = time.monotonic() + 10
        while counter.value < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        return counter.value
    it = iter(loader)
    assert settled(2 * prefetch) == 2 * prefetch  # they run ahead only this far
    next(it)
    assert settled(2 * prefetch + 1) == 2 * prefetch + 1  # one handed out, one more requested
    del it


def test_worker_seeds_info_and_init_fn():
    def tag_worker(worker_id):
        get_worker_info().dataset.tag = f"w{worker_id}"

    def run(seed):
        loader = DataLoader(WhoAmI(), batch_size=1, num_workers=2, seed=seed,
                            worker_init_fn=tag_worker)
        return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
                for b in loader]
    rows = run(7)
    by_worker = {r["id"][0]: r for r in rows}
    assert set(by_worker) == {0, 1}
    assert by_worker[1]["seed"][0] == by_worker[0]["seed"][0] + 1  # base + worker id
    assert all(r["tag"] == [f"w{r['id'][0]}"] for r in rows)
    assert by_worker[0]["np"] != by_worker[1]["np"] and by_worker[0]["py"] != by_worker[1]["py"]
    again = run(7)
    assert [(r["np"], r["py"], r["seed"]) for r in again] == \
        [(r["np"], r["py"], r["seed"]) for r in rows]  # same seed, same draws
    assert [r["np"] for r in run(8)] != [r["np"] for r in rows]
    np.random.seed(3)
    unseeded = [r["seed"] for r in run(None)]
    np.random.seed(3)
    assert [r["seed"] for r in run(None)] == unseeded  # seed=None follows numpy's generator
    assert get_worker_info() is None
    main = next(iter(DataLoader(WhoAmI(), batch_size=1)))
    assert main["id"].tolist() == [-1]


def test_persistent_workers_survive_epochs():
    def pids(loader):
        return {int(p) for b in loader for p in b["pid"]}
    persistent = DataLoader(WhoAmI(), batch_size=2, num_workers=2, persistent_workers=True)
    first = pids(persistent)
    assert pids(persistent) == first and len(first) == 2
    persistent.close()
    assert not multiprocessing.active_children()
    fresh = DataLoader(WhoAmI(), batch_size=2, num_workers=2)
    assert pids(fresh) != pids(fresh)  # new workers each epoch
    iterable = DataLoader(Sharded(9), 2, num_workers=2, persistent_workers=True)
    assert delivered(iterable) == delivered(iterable)  # each epoch restarts the stream
    broken = iter(iterable)
    next(broken)  # abandon an epoch half way: its late results are discarded
    assert sorted(sum(delivered(iterable), [])) == list(range(9))
    with pytest.raises(DataLoaderError, match="abandoned"):
        next(broken)  # it cannot steal the newer epoch's batches
    iterable.close()


def test_large_batches_come_back_through_shared_memory(own_segments):
    big = next(iter(DataLoader(Indexed(8, width=50_000), 8, num_workers=1)))
    small = next(iter(DataLoader(Indexed(8), 8, num_workers=1)))

    def bases(a):
        while a is not None:
            yield a
            a = getattr(a, "base", None)
    assert any(type(b).__name__ == "mmap" for b in bases(big["x"]))  # zero-copy mapping
    assert not any(type(b).__name__ == "mmap" for b in bases(small["x"]))  # pickled
    np.testing.assert_array_equal(big["x"][:, 0], np.arange(8))
    big["x"][0, 0] = -1.0  # the batch is an ordinary writable array
    assert own_segments() == []  # mapped and unlinked at once
    as_tensor = DataLoader(Indexed(8, width=50_000), 8, num_workers=1,
                           collate_fn=lambda s: ml.tensor(np.stack([x["x"] for x in s])))
    t = next(iter(as_tensor))
    assert isinstance(t, ml.Tensor) and any(type(b).__name__ == "mmap" for b in bases(t.data))
    np.testing.assert_array_equal(t.numpy()[:, -1], np.arange(8))


def test_segments_are_recycled_but_held_batches_never_overwritten():
    loader = DataLoader(Indexed(120, width=20_000), 2, num_workers=2, persistent_workers=True)
    held, names_seen, prefix = [], set(), None
    for k, batch in enumerate(loader):
        prefix = loader._pool.prefix
        names_seen.update(shm.leftover_segments(prefix))
        if k % 3 == 0:
            held.append(batch)  # kept: its segment must not be reused
    for batch in held:  # every held batch still has its own data
        np.testing.assert_array_equal(batch["x"], np.repeat(batch["index"][:, None], 20_000, 1))
    assert len(held) == 20 and len(names_seen) < 20 + 2 * 8  # the 40 dropped batches reused
    del held, batch
    again = [b["x"][:, 0].tolist() for b in loader]  # a second epoch on recycled segments
    assert again == [[2.0 * k, 2.0 * k + 1] for k in range(60)]
    assert shm.leftover_segments(prefix)  # recycled segments stay linked while in use
    loader.close()
    assert shm.leftover_segments(prefix) == []


def test_tensor_dataset_trains_through_the_loader():
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))
    loader = DataLoader(TensorDataset(x, ml.tensor(y)), batch_size=16, shuffle=True, seed=0,
                        num_workers=2)
    rows = 0
    for xb, yb in loader:
        np.testing.assert_allclose(xb @ np.array([1.0, -2.0, 0.5], np.float32), yb, rtol=1e-5)
        rows += len(xb)
    assert rows == 64 and len(loader) == 4


def test_batch_size_none_yields_samples():
    got = [b["index"] for b in DataLoader(Indexed(5), batch_size=None, num_workers=2)]
    assert got == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_and_forkserver_start_methods(method):
    x = np.arange(10)
    loader = DataLoader(TensorDataset(x), batch_size=4, num_workers=1,
                        multiprocessing_context=method)
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class HoldsLock(Indexed):
    def __init__(self):
        super().__init__(4)
        self.lock = threading.Lock()


def test_spawn_names_the_unpicklable_part():
    loader = DataLoader(HoldsLock(), num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(DataLoaderError, match=r"dataset \(HoldsLock object\): its attribute "
                                              r"'lock'.*cannot be pickled"):
        iter(loader)
    assert not multiprocessing.active_children()
    local = DataLoader(Indexed(3), num_workers=1, multiprocessing_context="spawn",
                       collate_fn=lambda batch: batch)
    with pytest.raises(DataLoaderError, match="collate_fn"):
        iter(local)
    assert delivered(DataLoader(HoldsLock(), 2, num_workers=1)) == [[0, 1], [2, 3]]  # fork


class FailsToUnpickle(Indexed):
    def __setstate__(self, state):
        raise AttributeError("Can't get attribute 'Indexed' on <module '__main__'>")


def test_spawned_worker_that_cannot_unpickle_is_reported():
    loader = DataLoader(FailsToUnpickle(4), num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(DataLoaderError, match=r"(?s)could not start: unpickle.*__main__.*fork"):
        list(loader)
    assert not multiprocessing.active_children()


@FEW
@given(n=st.integers(1, 20), batch=st.integers(1, 4), workers=st.integers(0, 2),
       shuffle=st.booleans(), in_order=st.booleans(), seeded=st.booleans(), data=st.data())
def test_resume_mid_epoch_delivers_exactly_the_rest(tmp_path_factory, n, batch, workers, shuffle,
                                                    in_order, seeded, data):
    extra = {} if workers == 0 else {"in_order": in_order}

    def make():
        return DataLoader(Indexed(n), batch, shuffle=shuffle, num_workers=workers,
                          seed=11 if seeded else None, **extra)
    original = make()
    delivered(original)  # one whole epoch first
    it = iter(original)
    stop = data.draw(st.integers(0, len(original)))
    head = [next(it)["index"].tolist() for _ in range(stop)]
    path = tmp_path_factory.mktemp("resume") / "loader.npz"
    ml.save({"loader": original.state_dict()}, path)
    tail = [b["index"].tolist() for b in it]
    resumed = make()
    resumed.load_state_dict(ml.load(path)["loader"])
    got = delivered(resumed)
    if tail:
        if workers == 0 or in_order:
            assert got == tail
        else:
            assert sorted(map(tuple, got)) == sorted(map(tuple, tail))
    else:  # saved when the epoch had delivered everything: the next epoch
        following = delivered(original)
        assert sorted(sum(got, [])) == list(range(n))
        if seeded and (workers == 0 or in_order):
            assert got == following
    assert sorted(sum(head + tail, [])) == list(range(n))
    if seeded and (workers == 0 or in_order):
        assert delivered(resumed) == delivered(original)  # later epochs agree too


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_resume_mid_epoch(workers):
    loader = DataLoader(Sharded(21), 2, num_workers=workers)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = loader.state_dict()
    tail = [b["index"].tolist() for b in it]
    resumed = DataLoader(Sharded(21), 2, num_workers=workers)
    resumed.load_state_dict(state)
    got = delivered(resumed)
    assert sorted(map(tuple, got)) == sorted(map(tuple, tail))
    assert sorted(sum(head + got, [])) == list(range(21))


FORK_AFTER_POOLS = textwrap.dedent("""
    import numba, numpy as np
    from threadpoolctl import threadpool_info
    from mlsys_lab.data import DataLoader, Dataset, get_worker_info

    @numba.njit(parallel=True)
    def total(x):
        s = 0.0
        for i in numba.prange(x.shape[0]):
            s += x[i]
        return s

    class UsesBoth(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            a = np.full((64, 64), float(i))
            blas = max(d["num_threads"] for d in threadpool_info()
                       if d["internal_api"] in ("openblas", "mkl", "blis"))
            return {"i": i, "sum": total(np.full(1000, float(i))), "mm": (a @ a)[0, 0],
                    "numba": numba.get_num_threads(), "blas": blas}

    big = np.random.rand(300, 300)
    big @ big                       # the parent starts BLAS's pool ...
    total(np.ones(100_000))         # ... and numba's
    print("layer", numba.threading_layer(), flush=True)
    parent_blas = max(d["num_threads"] for d in threadpool_info())
    try:
        for threads in (1, 2):  # UsesBoth is defined in __main__: fork needs no pickling
            loader = DataLoader(UsesBoth(), batch_size=2, num_workers=2, timeout=60,
                                worker_threads=threads)
            for b in loader:
                assert np.allclose(b["sum"], 1000 * b["i"])
                assert np.allclose(b["mm"], 64 * b["i"] ** 2)
                assert (b["numba"] == min(threads, numba.config.NUMBA_NUM_THREADS)).all(), b
                assert (b["blas"] == min(threads, parent_blas)).all(), b
        print("OK")
    except Exception as e:
        print("ERROR", type(e).__name__, e)
""")


def run_fork_script(layer):
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    done = subprocess.run([sys.executable, "-c", FORK_AFTER_POOLS], env=env, capture_output=True,
                          text=True, timeout=120)
    return done.stdout + done.stderr


def test_workers_fork_safely_after_numba_and_blas_pools_started():
    out = run_fork_script("forksafe")  # tbb if installed, else numba's workqueue
    assert "OK" in out, out


def test_default_numba_layer_after_fork_works_or_explains_itself():
    out = run_fork_script(None)
    if "layer omp" in out:  # GNU OpenMP refuses forked children: a clear error, not a hang
        assert "ERROR WorkerCrashedError" in out and "SIGTERM" in out, out
        assert "pip install tbb" in out and "NUMBA_THREADING_LAYER" in out, out
    else:
        assert "OK" in out, out


PIPELINE_AFTER_POOLS = textwrap.dedent("""
    import numba, numpy as np
    from mlsys_lab.data import Pipeline

    @numba.njit(parallel=True, nogil=True)
    def total(x):
        s = 0.0
        for i in numba.prange(x.shape[0]):
            s += x[i]
        return s

    total(np.ones(100_000))  # the parent starts numba's pool
    print("layer", numba.threading_layer(), flush=True)
    work = lambda i: total(np.full(5000, float(i)))
    for executor in ("thread", "process"):  # several threads at once; forked processes
        try:
            got = Pipeline.from_iterable(range(12)).map(work, num_parallel=2,
                                                        executor=executor).to_list()
            assert got == [5000.0 * i for i in range(12)], got
            print(executor, "OK", flush=True)
        except Exception as e:
            print(executor, "ERROR", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
""")


def test_pipeline_workers_after_numba_parallel_code_work_or_explain_themselves():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", PIPELINE_AFTER_POOLS], env=env,
                         capture_output=True, text=True, timeout=120).stdout
    assert "thread OK" in out, out  # every threading layer numba picks by default is thread-safe
    if "layer omp" in out:  # forked workers are terminated: said so, not a hang
        assert "process ERROR PipelineError" in out and "exit code -15" in out, out
        assert "pip install tbb" in out, out
    else:
        assert "process OK" in out, out
