"""Failures mid-run and checkpoint-restart: the same final parameters as a failure-free run."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.distributed import faults, sim
from mlsys_lab.errors import ArgumentError, CheckpointError


def _setup():
    model = ml.nn.Sequential(ml.nn.Linear(4, 8, rng=0), ml.nn.Tanh(), ml.nn.Linear(8, 1, rng=1))
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4))
    Y = np.sin(X.sum(axis=1, keepdims=True))
    opt = lambda ps: ml.optim.Adam(ps, lr=0.02)
    loss = lambda pred, y: ml.ops.mse_loss(pred, ml.tensor(y))
    return model, opt, loss, X, Y


COMMON = dict(steps=24, batch_size=32, checkpoint_every=5, input_noise=0.05)


def _cluster():
    return sim.Cluster(sim.ring(4, flops=1e9))


def _train(tmp_path, name, cfg=None, **kwargs):
    folder = tmp_path / name
    folder.mkdir()
    model, opt, loss, X, Y = _setup()
    options = dict(COMMON, **kwargs)
    return faults.fault_tolerant_train(model, opt, loss, X, Y, _cluster, str(folder),
                                       faults=cfg, **options)


def _max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b)


def _costs(**kw):
    return faults.FaultConfig(detect_seconds=2e-4, restart_seconds=1e-3,
                              checkpoint_seconds=1e-5, **kw)


def test_device_failure_restart_gives_the_failure_free_parameters(tmp_path):
    clean = _train(tmp_path, "clean", _costs())
    times = {step: t for t, step, _ in clean.curve}
    t_fail = (times[12] + times[13]) / 2  # during step 13: steps 11-12 are lost (ckpt at 10)
    failed = _train(tmp_path, "failed", _costs(device_failures={2: t_fail}))
    assert _max_diff(failed.state, clean.state) == 0.0
    assert [a["failed"] for a in failed.attempts] == ["DeviceFailure", None]
    assert failed.attempts[0]["resume_from"] == 10 and failed.lost_steps == 2
    assert [s for _, s, _ in failed.curve] == list(range(1, 25))
    np.testing.assert_allclose([x for *_, x in failed.curve], [x for *_, x in clean.curve])
    # time: the work after the checkpoint, detection and restart are all paid again
    assert failed.total_time == pytest.approx(clean.total_time + (t_fail - times[10]) + 2e-4
                                              + 1e-3, rel=0.02)
    target = clean.curve[15][2]
    tta_clean = faults.time_to_accuracy(clean.curve, target)
    tta_failed = faults.time_to_accuracy(failed.curve, target)
    assert tta_failed > tta_clean + 1e-3
    assert faults.time_to_accuracy(clean.curve, -1.0) is None


def test_link_failure_and_failure_before_the_first_checkpoint(tmp_path):
    clean = _train(tmp_path, "clean")
    times = {step: t for t, step, _ in clean.curve}
    link = _train(tmp_path, "link", faults.FaultConfig(link_failures={(1, 2): times[7]}))
    assert link.attempts[0]["failed"] == "LinkFailure" and link.attempts[0]["resume_from"] == 5
    assert _max_diff(link.state, clean.state) == 0.0
    early = _train(tmp_path, "early", faults.FaultConfig(device_failures={0: times[3]}))
    assert early.attempts[0]["resume_from"] == 0 and early.lost_steps >= 2
    assert _max_diff(early.state, clean.state) == 0.0


@pytest.mark.parametrize("skip", ["rngs", "sampler", "optimizer"])
def test_every_piece_of_state_matters(tmp_path, monkeypatch, skip):
    """Leave one piece out of the restore and the restarted run diverges."""
    clean = _train(tmp_path, "clean")
    times = {step: t for t, step, _ in clean.curve}
    real_restore = faults.restore_training_state

    def partial_restore(state, model, optimizer, sampler, generators):
        fresh = {"rngs": {}, "sampler": faults.BatchStream(200, 32, seed=1).state_dict(),
                 "optimizer": optimizer.state_dict()}
        state = dict(state, **{skip: fresh[skip]})
        if skip == "rngs":
            generators = {}
        return real_restore(state, model, optimizer, sampler, generators)

    monkeypatch.setattr(faults, "restore_training_state", partial_restore)
    broken = _train(tmp_path, "broken", faults.FaultConfig(device_failures={1: times[12]}))
    assert _max_diff(broken.state, clean.state) > 1e-6


def test_checkpoint_holds_adam_moments_steps_rngs_and_sampler(tmp_path):
    model, opt, loss, X, Y = _setup()
    optimizer = opt(model.parameters())
    sampler = faults.BatchStream(len(X), 64, seed=3)
    gens = {"noise": np.random.default_rng(2**100 + 7)}
    for _ in range(3):
        idx = sampler.next_batch()  # the 4th would start a new epoch (200 items)
        model.zero_grad()
        loss(model(ml.tensor(X[idx])), Y[idx]).backward()
        optimizer.step()
    gens["noise"].standard_normal(5)
    path = tmp_path / "state.npz"
    ml.save(faults.training_state(3, model, optimizer, sampler, gens), path)  # big ints fit
    state = ml.load(path)
    assert state["optimizer"]["step"] == 3
    assert set(state["optimizer"]["state"]["0"]) == {"m", "v"}
    assert np.any(state["optimizer"]["state"]["0"]["m"] != 0)

    model2, _, _, _, _ = _setup()
    optimizer2 = opt(model2.parameters())
    sampler2 = faults.BatchStream(len(X), 64, seed=99)
    gens2 = {"noise": np.random.default_rng(0)}
    assert faults.restore_training_state(state, model2, optimizer2, sampler2, gens2) == 3
    assert state["sampler"] == sampler.state_dict() and state["sampler"]["batches"] == 3
    for _ in range(5):  # over the epoch boundary
        np.testing.assert_array_equal(sampler2.next_batch(), sampler.next_batch())
    np.testing.assert_array_equal(gens2["noise"].random(4), gens["noise"].random(4))
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    for o in (optimizer, optimizer2):
        o.params[0].grad = ml.tensor(np.ones(o.params[0].shape))
        o.step()
    np.testing.assert_array_equal(optimizer.params[0].data, optimizer2.params[0].data)


def test_dropout_generator_state_roundtrip():
    ml.ops.manual_seed(5)
    ml.ops.rng_seed()
    saved = faults.dropout_rng_state()
    first = [int(ml.ops.rng_seed().numpy()) for _ in range(3)]
    faults.set_dropout_rng_state(saved)
    assert [int(ml.ops.rng_seed().numpy()) for _ in range(3)] == first


def test_fault_errors(tmp_path):
    model, opt, loss, X, Y = _setup()
    with pytest.raises(CheckpointError, match="does not exist"):
        faults.fault_tolerant_train(model, opt, loss, X, Y, _cluster, str(tmp_path / "nope"),
                                    **COMMON)
    with pytest.raises(ArgumentError, match="checkpoint_every"):
        faults.fault_tolerant_train(model, opt, loss, X, Y, _cluster, str(tmp_path),
                                    **dict(COMMON, checkpoint_every=0))
    with pytest.raises(CheckpointError, match="cannot restore"):
        faults.set_rng_state(np.random.default_rng(0), {"bit_generator": "MT19937"})
    with pytest.raises(ArgumentError, match="batch_size"):
        faults.BatchStream(4, 5)
