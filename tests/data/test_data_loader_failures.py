"""DataLoader failure paths: each gives its documented error (or a clean stop) within a bound and
leaves no worker process and no shared-memory segment behind."""

import gc
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

from mlsys_lab.data import (
    DataLoader,
    DataLoaderError,
    DataLoaderTimeoutError,
    Dataset,
    IterableDataset,
    RandomSampler,
    WorkerCrashedError,
    WorkerError,
)
from mlsys_lab.data.loader import shm
from mlsys_lab.errors import ArgumentError, ShapeError

BOUND_S = 5.0  # every failure must surface within this many seconds


class Big(Dataset):
    """Samples of 80 KB (so every batch goes through shared memory), optionally slow or faulty.

    ``fail``: index -> what happens when it is loaded ("raise", "sleep", "exit", "shape").
    """

    def __init__(self, n=40, delay=0.0, fail=None):
        self.n, self.delay, self.fail = n, delay, fail or {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        action = self.fail.get(i)
        if action == "raise":
            raise KeyError(f"sample {i} is corrupt")
        if action == "sleep":
            time.sleep(60)
        if action == "exit":
            os._exit(3)
        time.sleep(self.delay)
        width = 19_000 if action == "shape" else 20_000
        return {"index": i, "x": np.full(width, i, np.float32)}


@pytest.fixture
def clean(own_segments):
    """Asserts, after the test, that no child process and no segment of its loaders is left
    (giving shutdown a moment)."""
    yield
    deadline = time.monotonic() + BOUND_S
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
    assert own_segments() == []


def workers_of(before):
    return [p for p in multiprocessing.active_children() if p.pid not in before]


def test_worker_exception_names_worker_indices_and_traceback(clean):
    loader = DataLoader(Big(12, fail={6: "raise"}), batch_size=4, num_workers=2)
    it = iter(loader)
    first = next(it)
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        next(it)
    assert time.monotonic() - started < BOUND_S
    e = caught.value
    assert isinstance(e, RuntimeError) and isinstance(e, DataLoaderError)
    assert (e.worker_id, e.batch, e.indices, e.sample) == (1, 1, [4, 5, 6, 7], 6)
    message = str(e)
    assert "worker 1" in message and "[4, 5, 6, 7]" in message and "failing sample 6" in message
    assert "KeyError" in message and "in __getitem__" in message and 'raise KeyError(f"sample' \
        in message  # the worker's own traceback text
    assert isinstance(e.original, KeyError)
    rest = [b["index"].tolist() for b in it]  # as in PyTorch, the epoch goes on
    assert first["index"].tolist() == [0, 1, 2, 3] and rest == [[8, 9, 10, 11]]


def test_main_process_exception_is_the_original_with_a_note():
    loader = DataLoader(Big(8, fail={5: "raise"}), batch_size=4)
    with pytest.raises(KeyError, match="sample 5 is corrupt") as caught:
        list(loader)
    if sys.version_info >= (3, 11):  # exception notes
        assert any("sample indices [4, 5, 6, 7]" in note for note in caught.value.__notes__)


def test_collate_shape_mismatch_in_a_worker(clean):
    loader = DataLoader(Big(4, fail={2: "shape"}), batch_size=4, num_workers=1)
    with pytest.raises(WorkerError, match=r"(?s)collate_fn.*\['x'\].*sample 2 has \(19000,\)") \
            as caught:
        list(loader)
    assert isinstance(caught.value.original, ShapeError)


def test_sigkill_of_a_worker_is_detected_quickly(clean):
    before = {p.pid for p in multiprocessing.active_children()}
    loader = DataLoader(Big(200, delay=0.02), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    victim = workers_of(before)[0]
    os.kill(victim.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(WorkerCrashedError, match=rf"worker \d \(pid {victim.pid}\) was killed by "
                                                 r"SIGKILL while loading batch"):
        for _ in it:
            pass
    assert time.monotonic() - started < 2.0  # detected within about a second, no hang
    assert list(it) == []  # the iterator is closed


def test_worker_exiting_is_reported_with_its_exit_code(clean):
    loader = DataLoader(Big(8, fail={5: "exit"}), batch_size=2, num_workers=2)
    with pytest.raises(WorkerCrashedError, match=r"exited unexpectedly with exit code 3.*"
                                                 r"sample indices \[4, 5\]"):
        list(loader)


def test_timeout_raises_and_stops_the_stuck_worker(clean):
    loader = DataLoader(Big(20, fail={4: "sleep"}), batch_size=2, num_workers=2, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(DataLoaderTimeoutError, match=r"timed out after 0.5 s waiting for batch 2"
                                                     r" from worker 0 \(sample indices \[4, 5\]"):
        list(loader)
    assert 0.5 <= time.monotonic() - started < BOUND_S


@pytest.mark.parametrize("persistent", [False, True])
def test_early_break_leaves_nothing_behind(clean, persistent):
    loader = DataLoader(Big(60, delay=0.01), batch_size=4, num_workers=2,
                        persistent_workers=persistent, prefetch_factor=3)
    started = time.monotonic()
    for k, _ in enumerate(loader):
        if k == 2:
            break
    if persistent:
        assert len(multiprocessing.active_children()) == 2  # kept for the next epoch ...
        assert len(list(loader)) == 15
        loader.close()  # ... until closed
    assert time.monotonic() - started < BOUND_S


def test_exception_in_the_consumer_leaves_nothing_behind(clean):
    with pytest.raises(ValueError, match="training step failed"):
        for batch in DataLoader(Big(60), batch_size=4, num_workers=2):
            if batch["index"][0] >= 0:
                raise ValueError("training step failed")


def test_garbage_collected_iterator_leaves_nothing_behind(clean):
    loader = DataLoader(Big(60), batch_size=4, num_workers=2, shuffle=True)
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert multiprocessing.active_children() == []  # shut down synchronously


def test_worker_init_fn_failure_is_reported(clean):
    def init(worker_id):
        raise ValueError(f"no config for worker {worker_id}")
    loader = DataLoader(Big(8), batch_size=2, num_workers=2, worker_init_fn=init)
    started = time.monotonic()
    with pytest.raises(DataLoaderError, match=r"(?s)could not start: worker_init_fn raised "
                                              r"ValueError: no config for worker.*Traceback"):
        list(loader)
    assert time.monotonic() - started < BOUND_S


class Broken(IterableDataset):
    def __iter__(self):
        yield 1
        raise OSError("stream broke")


def test_iterable_dataset_exception(clean):
    loader = DataLoader(Broken(), batch_size=2, num_workers=1)
    with pytest.raises(WorkerError, match="OSError in fetch.*stream broke"):
        list(loader)


def test_full_shared_memory_falls_back_to_pickling(clean, monkeypatch):
    def full(name, size):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(shm, "_create", full)  # the forked workers inherit it
    got = [b["x"][:, 0].tolist() for b in DataLoader(Big(8), batch_size=4, num_workers=2)]
    assert got == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


@pytest.mark.parametrize("kwargs, name", [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": -3}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"num_workers": -1}, "num_workers"),
    ({"timeout": -1}, "timeout"),
    ({"prefetch_factor": 2}, "prefetch_factor"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
    ({"shuffle": True, "sampler": [0, 1]}, "sampler"),
    ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler"),
    ({"batch_sampler": [[0]], "shuffle": True}, "batch_sampler"),
    ({"batch_sampler": [[0]], "sampler": [0]}, "batch_sampler"),
    ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler"),
    ({"batch_size": None, "drop_last": True}, "drop_last"),
    ({"persistent_workers": True}, "persistent_workers"),
    ({"num_workers": 1, "multiprocessing_context": "teleport"}, "multiprocessing_context"),
    ({"multiprocessing_context": "spawn"}, "multiprocessing_context"),
    ({"worker_init_fn": 3, "num_workers": 1}, "worker_init_fn"),
    ({"collate_fn": "stack"}, "collate_fn"),
    ({"seed": -1}, "seed"),
    ({"num_workers": 1, "worker_threads": 0}, "worker_threads"),
    ({"in_order": "yes"}, "in_order"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, name):
    with pytest.raises(ArgumentError, match=name) as caught:
        DataLoader(Big(4), **kwargs)
    assert isinstance(caught.value, ValueError)


def test_iterable_dataset_refuses_samplers_and_shuffle():
    for kwargs in ({"shuffle": True}, {"sampler": RandomSampler(range(3))},
                   {"batch_sampler": [[0]]}):
        with pytest.raises(ArgumentError, match="IterableDataset"):
            DataLoader(Broken(), **kwargs)


def test_bad_state_is_refused():
    loader = DataLoader(Big(4), batch_size=2)
    with pytest.raises(ArgumentError, match="not a DataLoader state"):
        loader.load_state_dict({"epoch": 3})
    with pytest.raises(ArgumentError, match="iterable-style"):
        loader.load_state_dict(DataLoader(Broken(), batch_size=2).state_dict())
    state = DataLoader(Broken(), batch_size=2, num_workers=2).state_dict()
    state["in_epoch"] = True
    with pytest.raises(ArgumentError, match="num_workers=2"):
        DataLoader(Broken(), batch_size=2).load_state_dict(state)
