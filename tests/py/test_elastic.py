"""Elastic resume through stoker.Loader (docs/engine.md): a state dict saved
by rank 0 of one world restores onto every rank of another, and the rest of
the epoch is delivered exactly once across the new ranks with equal batch
counts; old state dicts still load. Ranks are in-process loaders here;
tests/py/test_distributed.py does the same with torchrun processes."""

import collections

import pytest

import stoker


def _run(rec, world, steps, state=None, batch_size=4, local=None, seed=3, drop_last=False):
    """Every rank of `world` for `steps` batches (None: to the end) after
    restoring `state`: (Counter of delivered labels, rank 0's state dict,
    batches per rank)."""
    seen = collections.Counter()
    counts = []
    sd0 = None
    for r in range(world):
        with stoker.Loader(rec, batch_size, rank=r, world_size=world, seed=seed,
                           local_world_size=local, drop_last=drop_last,
                           output="numpy") as L:
            if state is not None:
                L.load_state_dict(state)
            n = 0
            it = iter(L)
            while steps is None or n < steps:
                try:
                    _, labels = next(it)
                except StopIteration:
                    break
                seen.update(int(x) for x in labels)
                n += 1
            counts.append(n)
            if r == 0:
                sd0 = L.state_dict()
    return seen, sd0, counts


@pytest.mark.parametrize("plan", [
    [(3, 5), (2, None)],
    [(3, 3), (4, None)],
    [(3, 4), (2, 6), (4, None)],
    [(2, 2), (6, None)],
])
@pytest.mark.parametrize("drop_last", [False, True])
def test_world_changes_deliver_the_rest_once(make_records, plan, drop_last):
    n = 203
    rec = make_records(n)
    seen = collections.Counter()
    state = None
    for world, steps in plan:
        got, state, counts = _run(rec, world, steps, state, drop_last=drop_last)
        assert len(set(counts)) == 1, counts  # equal batch counts in a world
        seen += got
        if steps is not None:
            assert state["history"] is not None
    missing = [i for i in range(n) if not seen[i]]
    extra = sum(c - 1 for c in seen.values() if c > 1)
    if drop_last:
        assert extra == 0 and len(missing) < plan[-1][0] * 4
    else:
        assert not missing and extra <= sum(w - 1 for w, _ in plan)


def test_state_dict_records_the_worlds(make_records):
    rec = make_records(100)
    _, sd1, _ = _run(rec, 3, 2)
    assert sd1["world_size"] == 3 and sd1["history"] == [] and sd1["batch"] == 2
    _, sd2, _ = _run(rec, 2, 3, sd1)
    assert sd2["history"] == [{"world_size": 3, "local_world_size": 3, "batch_size": 4,
                               "batches": 2}]
    assert sd2["world_size"] == 2 and sd2["batch"] == 3 and sd2["epoch"] == 0
    # The global batch kept: 2 ranks of 6 after 3 of 4.
    seen, _, _ = _run(rec, 2, None, sd2, batch_size=6)
    assert seen  # another batch size continues too


def test_old_state_dicts_still_load(make_records):
    rec = make_records(40)
    with stoker.Loader(rec, 4, seed=1, output="numpy") as L:
        L.load_state_dict({"seed": 1, "epoch": 0, "batch": 3, "batch_size": 4,
                           "num_samples": 40, "rank": 0, "world_size": 1, "drop_last": False,
                           "shuffle": True})
        assert L.state_dict()["batch"] == 3
        assert sum(len(y) for _, y in L) == 40 - 12


def test_bad_history_is_refused(make_records):
    rec = make_records(40)
    with stoker.Loader(rec, 4, seed=1, output="numpy", world_size=2, rank=0) as L:
        sd = L.state_dict()
        sd["world_size"] = 3
        sd["history"] = [{"world_size": 2}]
        with pytest.raises(ValueError, match="history"):
            L.load_state_dict(sd)
        sd["history"] = [{"world_size": 4, "local_world_size": 3, "batch_size": 4,
                          "batches": 1}]
        with pytest.raises(ValueError, match="whole number of nodes"):
            L.load_state_dict(sd)
    with pytest.raises(ValueError, match="does not divide"):
        stoker.Loader(rec, 4, world_size=4, rank=0, local_world_size=3)
