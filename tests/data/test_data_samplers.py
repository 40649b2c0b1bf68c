"""Samplers, datasets and default_collate of mlsys_lab.data (no worker processes here).

Oracles: the documented PyTorch properties written out with numpy, and PyTorch itself for the
deterministic cases when torch is installed.
"""

import collections
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.data import (
    BatchSampler,
    ConcatDataset,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    default_collate,
    random_split,
)
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError

from ..conformance import torch_misc_reference

try:
    import torch.utils.data as torch_data
except ImportError:  # CI may not have torch
    torch_data = None

FAST = settings(max_examples=60, deadline=None)


def interleave(shards):
    """The padded/truncated global order, rebuilt from the per-rank lists."""
    total = sum(len(s) for s in shards)
    full = np.empty(total, np.int64)
    for rank, shard in enumerate(shards):
        full[rank::len(shards)] = shard
    return full


@FAST
@given(n=st.integers(0, 60), replicas=st.integers(1, 7), shuffle=st.booleans(),
       drop_last=st.booleans(), seed=st.integers(0, 2**32), epoch=st.integers(0, 5))
def test_distributed_sampler_has_pytorchs_properties(n, replicas, shuffle, drop_last, seed, epoch):
    shards = []
    for rank in range(replicas):
        s = DistributedSampler(range(n), replicas, rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        shards.append(list(s))
        assert len(shards[-1]) == len(s)
    expected_len = n // replicas if drop_last else math.ceil(n / replicas)
    assert all(len(shard) == expected_len for shard in shards)  # equal shard lengths
    full = interleave(shards)
    if drop_last:  # the first floor(n/R)*R indices of one permutation: all distinct
        assert len(set(full.tolist())) == len(full) == expected_len * replicas
    elif n:
        assert sorted(full[:n].tolist()) == list(range(n))  # a permutation, then padding
        assert full[n:].tolist() == np.resize(full[:n], len(full) - n).tolist()  # repetition
        assert set(full.tolist()) == set(range(n))  # the union covers every index
    if n % replicas == 0:
        assert sum(map(len, shards)) == len(set().union(*map(set, shards)))  # disjoint
    if not shuffle:
        assert full[:min(n, len(full))].tolist() == list(range(min(n, len(full))))


@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_distributed_sampler_equals_torch(drop_last):
    ref = torch_misc_reference("sampler")  # torch's DistributedSampler(shuffle=False), committed
    lengths = iter(ref[f"{drop_last}::lengths"].tolist())
    theirs = iter(ref[f"{drop_last}::indices"].tolist())
    for n in range(0, 25):
        for replicas in range(1, 6):
            for rank in range(replicas):
                ours = DistributedSampler(range(n), replicas, rank, shuffle=False,
                                          drop_last=drop_last)
                assert list(ours) == [next(theirs) for _ in range(next(lengths))], \
                    (n, replicas, rank)
    assert next(lengths, None) is None and next(theirs, None) is None  # all of them compared


def test_distributed_sampler_epochs_and_seeds():
    def order(seed, epoch, rank=0):
        s = DistributedSampler(range(50), 2, rank, seed=seed)
        s.set_epoch(epoch)
        return list(s)
    assert order(3, 1) == order(3, 1)            # same seed and epoch: same order
    assert order(3, 1) != order(3, 2)            # set_epoch changes the order
    assert order(3, 1) != order(4, 1)
    assert order(0, 1) != order(1, 0)            # (seed, epoch) is not seed + epoch
    assert not set(order(3, 1, 0)) & set(order(3, 1, 1))  # ranks share the permutation


def test_distributed_sampler_reads_the_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(range(9), shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (3, 2, [2, 5, 8])


@FAST
@given(n=st.integers(1, 40), seed=st.integers(0, 1000), extra=st.integers(1, 90))
def test_random_sampler_orders(n, seed, extra):
    perm = list(RandomSampler(range(n), seed=seed))
    assert sorted(perm) == list(range(n))
    assert perm == list(RandomSampler(range(n), seed=seed))  # same seed, same order
    longer = list(RandomSampler(range(n), num_samples=extra, seed=seed))
    assert len(longer) == extra
    for start in range(0, extra, n):  # without replacement: whole permutations back to back
        block = longer[start:start + n]
        assert len(set(block)) == len(block)
    drawn = list(RandomSampler(range(n), replacement=True, num_samples=extra, seed=seed))
    assert len(drawn) == extra and all(0 <= i < n for i in drawn)


def test_random_sampler_epochs_differ_and_global_seed_reproduces():
    s = RandomSampler(range(30), seed=7)
    first, second = list(s), list(s)
    assert first != second and sorted(first) == sorted(second)
    fresh = RandomSampler(range(30), seed=7)
    assert [list(fresh), list(fresh)] == [first, second]  # the epoch sequence is seeded
    np.random.seed(11)
    a = list(RandomSampler(range(30)))
    np.random.seed(11)
    assert list(RandomSampler(range(30))) == a  # seed=None follows numpy's global generator


def test_with_replacement_repeats_indices():
    drawn = list(RandomSampler(range(5), replacement=True, num_samples=200, seed=0))
    counts = collections.Counter(drawn)
    assert set(counts) == set(range(5)) and max(counts.values()) > 1


@FAST
@given(n=st.integers(0, 40), batch=st.integers(1, 9), drop_last=st.booleans())
def test_batch_sampler_chunks_the_order(n, batch, drop_last):
    sampler = RandomSampler(range(n), seed=1)
    batches = list(BatchSampler(sampler, batch, drop_last))
    order = list(RandomSampler(range(n), seed=1))
    chunks = [order[i:i + batch] for i in range(0, n, batch)]
    if drop_last and chunks and len(chunks[-1]) < batch:
        chunks.pop()
    assert batches == chunks
    assert len(BatchSampler(sampler, batch, drop_last)) == len(chunks)
    assert list(BatchSampler(list(range(n)), batch, drop_last)) == \
        [list(range(n))[i:i + batch] for i in range(0, len(chunks) * batch, batch)]
    if torch_data is not None:
        theirs = torch_data.BatchSampler(torch_data.SequentialSampler(range(n)), batch, drop_last)
        assert list(BatchSampler(SequentialSampler(range(n)), batch, drop_last)) == list(theirs)


def make_sampler(kind, n, seed):
    if kind == "sequential":
        return SequentialSampler(range(n))
    if kind == "random":
        return RandomSampler(range(n), seed=seed)
    if kind == "random_unseeded":
        return RandomSampler(range(n))
    if kind == "subset":
        return SubsetRandomSampler(range(0, 2 * n, 2), seed=seed)
    s = DistributedSampler(range(n), 3, 1, seed=seed)
    s.set_epoch(4)
    return s


@FAST
@given(kind=st.sampled_from(["sequential", "random", "random_unseeded", "subset", "distributed"]),
       n=st.integers(1, 30), data=st.data(), seed=st.integers(0, 99))
def test_sampler_resumes_mid_epoch(tmp_path_factory, kind, n, data, seed):
    original = make_sampler(kind, n, seed)
    list(original)  # an epoch before, so the resumed one is not the first
    it = iter(original)
    full = list(make_sampler(kind, n, seed)) if kind == "sequential" else None
    taken = [next(it) for _ in range(data.draw(st.integers(0, len(original))))]
    path = tmp_path_factory.mktemp("state") / "sampler.npz"
    ml.save({"sampler": original.state_dict()}, path)  # plain values only
    rest = list(it)
    resumed = make_sampler(kind, n, seed + 1)  # a different seed: the state must carry it
    resumed.load_state_dict(ml.load(path)["sampler"])
    if rest:
        assert list(resumed) == rest
    elif kind == "random_unseeded":  # the next epoch, drawn from numpy's global generator
        assert sorted(resumed) == sorted(taken)
    else:  # a state taken at the end of an epoch resumes with the next epoch
        assert list(resumed) == list(original)
    if full is not None:
        assert taken + rest == full
    if kind in ("random", "subset"):
        assert list(resumed) == list(original)  # and the epoch after is the same one too


def test_batch_sampler_resumes_over_a_plain_list():
    b = BatchSampler(list(range(10)), 3, False)
    it = iter(b)
    next(it)
    state = b.state_dict()
    again = BatchSampler(list(range(10)), 3, False)
    again.load_state_dict(state)
    assert list(again) == [[3, 4, 5], [6, 7, 8], [9]] == list(it)


@pytest.mark.parametrize("make, name", [
    (lambda: DistributedSampler(range(5), 0, 0), "num_replicas"),
    (lambda: DistributedSampler(range(5), 2, 2), "rank"),
    (lambda: DistributedSampler(range(5), 2, -1), "rank"),
    (lambda: DistributedSampler(range(5), 2, 0, seed=None), "seed"),
    (lambda: BatchSampler(range(5), 0, False), "batch_size"),
    (lambda: BatchSampler(range(5), 2, "no"), "drop_last"),
    (lambda: RandomSampler(range(5), num_samples=0), "num_samples"),
    (lambda: RandomSampler(range(5), seed=-1), "seed"),
    (lambda: RandomSampler(range(5), replacement=1), "replacement"),
])
def test_sampler_arguments_are_checked(make, name):
    with pytest.raises(ArgumentError, match=name):
        make()


def test_subset_concat_tensor_datasets():
    class Squares(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if not 0 <= i < self.n:
                raise IndexError(i)
            return i * i
    a, b = Squares(3), Squares(4)
    joined = a + b
    assert isinstance(joined, ConcatDataset) and len(joined) == 7
    assert [joined[i] for i in range(7)] == [0, 1, 4, 0, 1, 4, 9]
    assert joined[-1] == 9 and joined[-7] == 0
    with pytest.raises(IndexError):
        joined[7]
    sub = Subset(joined, [6, 0, 3])
    assert [sub[i] for i in range(3)] == [9, 0, 0] and sub.__getitems__([0, 1]) == [9, 0]
    x, y = np.arange(12).reshape(6, 2), ml.tensor(np.arange(6.0))
    ds = TensorDataset(x, y)
    assert len(ds) == 6 and ds[4][0].tolist() == [8, 9] and float(ds[4][1]) == 4.0
    with pytest.raises(ShapeError, match=r"\(6, 2\), \(5,\)"):
        TensorDataset(x, np.zeros(5))


@FAST
@given(n=st.integers(0, 50), cuts=st.lists(st.integers(0, 50), max_size=3), seed=st.integers(0, 9))
def test_random_split_is_a_partition(n, cuts, seed):
    cuts = sorted(min(c, n) for c in cuts)
    lengths = np.diff([0, *cuts, n]).tolist()
    parts = random_split(list(range(n)), lengths, seed=seed)
    assert [len(p) for p in parts] == lengths
    together = [p[i] for p in parts for i in range(len(p))]
    assert sorted(together) == list(range(n))
    with pytest.raises(ArgumentError):
        random_split(list(range(n)), [*lengths, 1])


def test_random_split_fractions():
    parts = random_split(list(range(10)), [0.5, 0.3, 0.2], seed=0)
    assert [len(p) for p in parts] == [5, 3, 2]


Point = collections.namedtuple("Point", "x y")


def test_default_collate_nested_structures_against_numpy():
    rng = np.random.default_rng(0)
    samples = [{"image": rng.random((3, 4), dtype=np.float32), "label": k, "w": 0.5 * k,
                "pair": (np.int16(k), ml.tensor([k, k + 1.0])), "name": f"s{k}",
                "p": Point(k, [k, 2 * k]), "flag": k % 2 == 0} for k in range(5)]
    batch = default_collate(samples)
    np.testing.assert_array_equal(batch["image"], np.stack([s["image"] for s in samples]))
    assert batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int64 and batch["label"].tolist() == list(range(5))
    assert batch["w"].dtype == np.float64
    assert batch["flag"].dtype == np.bool_ and batch["flag"].tolist() == [True, False] * 2 + [True]
    assert isinstance(batch["pair"], list)  # PyTorch returns a list for tuple samples
    assert batch["pair"][0].dtype == np.int16
    assert isinstance(batch["pair"][1], np.ndarray) and batch["pair"][1].shape == (5, 2)
    assert batch["name"] == [f"s{k}" for k in range(5)]
    assert isinstance(batch["p"], Point) and batch["p"].y[1].tolist() == [0, 2, 4, 6, 8]
    assert default_collate([1, 2.5]).dtype == np.float64  # mixed numbers widen


def test_default_collate_names_the_path_of_a_mismatch():
    good = {"a": [np.zeros(3), np.zeros((2, 2))]}
    bad = {"a": [np.zeros(3), np.zeros((2, 3))]}
    with pytest.raises(ShapeError, match=r"\['a'\]\[1\].*sample 0 has \(2, 2\), sample 2 has "
                                         r"\(2, 3\)"):
        default_collate([good, good, bad])
    with pytest.raises(ShapeError, match="keys"):
        default_collate([{"a": 1}, {"b": 1}])
    with pytest.raises(ShapeError, match="length"):
        default_collate([(1, 2), (1, 2, 3)])
    with pytest.raises(DTypeError, match="NoneType"):
        default_collate([None, None])
    with pytest.raises(DTypeError, match="object array"):
        default_collate([np.array([object()]), np.array([object()])])
    with pytest.raises(DTypeError, match="sample 1"):
        default_collate([np.zeros(2), 3])
    with pytest.raises(ShapeError, match="empty"):
        default_collate([])
