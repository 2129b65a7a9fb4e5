"""``from ferry import DataLoader`` (issue 30, points 6 and 9): torch's DataLoader signature, batches and draws, with
Ferry's producers. Each test failed on the code before it (there was no ferry.DataLoader; RemoteLoader's
positional call was a bare TypeError).

Real producer processes (forked) and torch's own DataLoader side by side, from the same global generator state.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.utils.data

import ferry
from ferry import ConfigError, ConfigTypeError, RemoteLoader
from ferry.consumer.dataloader.engine import OWN_KEYWORDS

from . import port_datasets as pdata
from .helpers import LeakCheck, free_port

QUIET = {"log_every": None, "heartbeat": 0.2}


def indices(batches) -> list[list[int]]:
    return [b["index"].tolist() if isinstance(b, dict) else b[0].tolist() for b in batches]


def torch_passes(dataset, passes: int, seed: int, **options) -> tuple[list, torch.Tensor]:
    """DataLoader's batches over ``passes`` iter()s after torch.manual_seed(seed), and the global state after."""
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(dataset, **options)
    batches = [indices(loader) for _ in range(passes)]
    return batches, torch.get_rng_state()


# --- the signature ----------------------------------------------------------------------------------------------
def test_signature_is_torchs_then_ferrys_own():
    """Every parameter of the installed torch's DataLoader, in order, of the same kind and default (a torch that adds
    one fails here), then Ferry's own, keyword-only, with RemoteLoader's names and defaults."""
    theirs = list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters.values())
    ours = list(inspect.signature(ferry.DataLoader.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.kind, p.default) for p in theirs]
    extra = ours[len(theirs):]
    assert [p.name for p in extra] == list(OWN_KEYWORDS)
    assert all(p.kind is p.KEYWORD_ONLY for p in extra)
    remote = inspect.signature(RemoteLoader.__init__).parameters
    differs = {p.name for p in extra if remote[p.name].default is not p.default and remote[p.name].default != p.default}
    assert differs == {"buffer_batches"}  # not given: prefetch_factor x num_workers where that is given


def test_a_subclass_of_torchs_with_its_attributes_and_checks():
    dataset = pdata.Indexed()
    loader = ferry.DataLoader(dataset, 4, shuffle=True, num_workers=2)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler) and loader.batch_sampler.batch_size == 4
    assert loader.collate_fn is torch.utils.data.default_collate and loader.prefetch_factor == 2 and len(loader) == 3
    with pytest.raises(ValueError, match="should not be set"):
        loader.batch_size = 8
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        ferry.DataLoader(dataset, persistent_workers=True)
    with pytest.raises(ConfigError, match="on_error"):
        ferry.DataLoader(dataset, num_workers=1, on_error=3)
    loader.close()


def test_remote_loader_positional_call_says_what_to_write():
    """Point 6: ``RemoteLoader(ds, batch_size=8)`` was a bare TypeError ("takes 1 positional argument")."""
    with pytest.raises(TypeError, match=r"keyword arguments only.*RemoteLoader\(dataset=ds.*from ferry import DataLoader"):
        RemoteLoader(pdata.Indexed(), batch_size=8)
    with pytest.raises(ConfigError, match="from ferry import DataLoader"):
        RemoteLoader(dataset=pdata.Indexed(), num_workers=2)


def test_building_starts_nothing():
    """Frameworks build loaders they never iterate (Lightning re-instantiates one): no producer, port or thread."""
    leaks = LeakCheck()
    loaders = [ferry.DataLoader(pdata.Indexed(), 2, num_workers=2, **QUIET) for _ in range(3)]
    assert all(loader.stats()["local_producers"] == 0 for loader in loaders)
    leaks.assert_clean(timeout=0.5)
    del loaders


# --- the draws: DataLoader's orders, its generator use ---------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_iter_draws_as_dataloader(num_workers):
    """Point 9: without a generator each iter() draws from torch's global generator as the default DataLoader does:
    the same orders after torch.manual_seed, epoch 1 included, and the global generator left where DataLoader leaves
    it. (A dataset that draws from it is another matter: DataLoader(num_workers=0) lets its draws move the trainer's
    generator, ferry.DataLoader keeps the trainer's generators as they were around each sample.)"""
    dataset = pdata.Indexed(10)
    expected, state = torch_passes(dataset, 3, 7, batch_size=3, shuffle=True)
    torch.manual_seed(7)
    with ferry.DataLoader(dataset, batch_size=3, shuffle=True, num_workers=num_workers, **QUIET) as loader:
        got = [indices(loader) for _ in range(3)]
    assert got == expected
    assert torch.equal(torch.get_rng_state(), state)


def test_persistent_workers_draw_their_seed_once():
    dataset = pdata.Indexed(10)
    expected, state = torch_passes(dataset, 2, 3, batch_size=4, shuffle=True, num_workers=1, persistent_workers=True)
    torch.manual_seed(3)
    with ferry.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=1, persistent_workers=True,
                          **QUIET) as loader:
        assert [indices(loader) for _ in range(2)] == expected
    assert torch.equal(torch.get_rng_state(), state)


def test_a_new_iter_after_an_abandoned_pass_draws_a_new_order():
    """Point 9: a pass left after one batch, then a new iter(): DataLoader draws a new order; so does this."""
    dataset = pdata.Indexed(12)

    def passes(make):
        torch.manual_seed(11)
        loader = make()
        first = [next(iter(loader)).index.tolist()]
        return first + [indices(loader)], loader

    expected, _ = passes(lambda: torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True))
    got, loader = passes(lambda: ferry.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, **QUIET))
    loader.close()
    assert got == expected and got[0] != got[1][0]


# --- num_workers=0, and the same pixels with producers ----------------------------------------------------------------
def test_num_workers_0_loads_here_with_the_pixels_producers_give():
    """num_workers=0 loads in the calling thread (a debugger stops in __getitem__), binds nothing, starts nothing;
    and its samples are those 2 producers give, augmentations included."""
    dataset = pdata.Augmented(8)
    leaks = LeakCheck()
    torch.manual_seed(5)
    here = ferry.DataLoader(dataset, batch_size=4, seed=9)
    import random

    import numpy as np

    before = (np.random.get_state()[1].copy(), random.getstate())
    mine = list(here)
    after = (torch.get_rng_state(), np.random.get_state()[1], random.getstate())
    torch.manual_seed(5)
    torch.empty((), dtype=torch.int64).random_()  # DataLoader's one draw of the pass (its sampler draws none)
    assert torch.equal(after[0], torch.get_rng_state())  # the samples' draws did not move the trainer's generators
    assert (before[0] == after[1]).all() and before[1] == after[2]
    assert {int(t) for b in mine for t in b["thread"]} == {threading.get_ident()}
    leaks.assert_clean(timeout=0.5)
    torch.manual_seed(5)
    with ferry.DataLoader(dataset, batch_size=4, seed=9, num_workers=2, **QUIET) as loader:
        theirs = list(loader)
        producers = set(loader.stats()["local_producer_pids"]) if "local_producer_pids" in loader.stats() else None
    assert [b["index"].tolist() for b in theirs] == [b["index"].tolist() for b in mine]
    assert all(torch.equal(a["augmented"], b["augmented"]) for a, b in zip(mine, theirs))
    assert {int(p) for b in theirs for p in b["pid"]}.isdisjoint({int(p) for b in mine for p in b["pid"]})
    del producers


# --- resume ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_resumes_the_pass_it_drew(num_workers):
    """state_dict() mid-pass, in JSON, resumed by a new loader after the global generator moved on: the rest of that
    pass (drawn again from what it drew), then the next pass as the first run drew it (the trainer restores its
    global generator state from its checkpoint, as with DataLoader)."""
    dataset = pdata.Augmented(14)
    options = dict(batch_size=3, shuffle=True, num_workers=num_workers, **QUIET)
    torch.manual_seed(21)
    with ferry.DataLoader(dataset, **options) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        state, rng = json.loads(json.dumps(loader.state_dict())), torch.get_rng_state()
        rest = list(it)
        after = list(loader)
    torch.manual_seed(999)  # another process, whose generator is elsewhere until the checkpoint restores it
    with ferry.DataLoader(dataset, **options) as resumed:
        resumed.load_state_dict(state)
        torch.set_rng_state(rng)
        got_rest, got_after = list(resumed), list(resumed)
    assert indices(got_rest) == indices(rest) and indices(got_after) == indices(after)
    assert all(torch.equal(a["augmented"], b["augmented"]) for a, b in zip(got_rest + got_after, rest + after))
    assert len(head) == 2


def test_a_state_of_another_sampler_epoch_is_refused():
    dataset = pdata.Indexed(16)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True)
    loader = ferry.DataLoader(dataset, batch_size=2, sampler=sampler)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = ferry.DataLoader(dataset, batch_size=2,
                             sampler=torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True))
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match="drew other batches"):
        iter(other)


# --- the dataset is taken at the first iter(); classes come back as themselves ---------------------------------------
def test_len_follows_the_dataset_until_the_first_iter():
    """torch: TestDataLoader.test_growing_dataset, for ferry.DataLoader (point 9)."""
    dataset = [torch.ones(4) for _ in range(4)]
    sequential = ferry.DataLoader(dataset, num_workers=2, shuffle=False, **QUIET)
    shuffled = ferry.DataLoader(dataset, num_workers=2, shuffle=True, **QUIET)
    dataset.append(torch.ones(4))
    assert len(sequential) == 5 and len(shuffled) == 5
    with sequential, shuffled:
        assert len(list(sequential)) == 5


def test_namedtuple_batches_are_the_users_class():
    with ferry.DataLoader(pdata.Indexed(6), batch_size=3, num_workers=1, **QUIET) as loader:
        batches = list(loader)
    assert all(type(b) is pdata.Sample for b in batches)
    assert [b.index.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]


def test_close_leaves_nothing():
    leaks = LeakCheck()
    loader = ferry.DataLoader(pdata.Indexed(6), batch_size=3, num_workers=2, **QUIET)
    assert len(list(loader)) == 2 and loader.stats()["local_producers"] == 2
    loader.close()
    leaks.assert_clean()
    with pytest.raises(ferry.LoaderClosedError):
        iter(loader)


def test_a_class_named_by_the_scripts_file_is_the_scripts_own(monkeypatch):
    """The unit of the test below: ``train:Pair`` from a producer that imported ``python train.py`` as ``train`` is
    ``__main__``'s Pair (run by path: no spec), and ``pkg.train:Pair`` for ``python -m pkg.train``; nothing else."""
    import collections
    import types

    from ferry.common.batch_types import find_class, namedtuple_class

    script = types.ModuleType("__main__")
    script.__file__, script.__spec__ = "/somewhere/train.py", None
    script.Pair = collections.namedtuple("Pair", ["index", "value"])
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert namedtuple_class("train:Pair", ["index", "value"], 2, "batch") is script.Pair
    assert find_class("other:Pair") is None and find_class("pkg.train:Pair") is None
    script.__spec__ = types.SimpleNamespace(name="pkg.train")
    assert find_class("pkg.train:Pair") is script.Pair and find_class("train:Pair") is None


@pytest.mark.slow
def test_the_training_scripts_namedtuple_comes_back_as_its_own():
    """Point 9: a namedtuple class of the training script (``__main__``) from a producer that imported the script by
    its file's name (``--dataset train:Samples``) came back as a look-alike class, not the script's own."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main_namedtuple_trainer.py")
    done = subprocess.run([sys.executable, script, f"tcp://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"own": True, "indices": [[0, 1], [2, 3]]}


# --- the other shapes DataLoader takes -------------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_as_dataloader_reads_it(num_workers):
    expected = [b.tolist() for b in torch.utils.data.DataLoader(pdata.Stream(10), batch_size=3,
                                                                 num_workers=num_workers)]
    with ferry.DataLoader(pdata.Stream(10), batch_size=3, num_workers=num_workers, **QUIET) as loader:
        assert [b.tolist() for b in loader] == expected


@pytest.mark.parametrize("num_workers", [0, 1])
def test_unbatched_and_getitems_as_dataloader(num_workers):
    dataset = pdata.Indexed(5)
    expected = [tuple(s) for s in torch.utils.data.DataLoader(dataset, batch_size=None)]
    with ferry.DataLoader(dataset, batch_size=None, num_workers=num_workers, **QUIET) as loader:
        got = [tuple(s) for s in loader]
    assert [(int(i), v.tolist()) for i, v in got] == [(int(i), v.tolist()) for i, v in expected]
    if num_workers == 0:  # DataLoader's fetcher calls __getitems__ for a batch (a producer loads one at a time)
        bulk = [b.tolist() for b in ferry.DataLoader(pdata.Bulk(), batch_size=4)]
        assert bulk == [b.tolist() for b in torch.utils.data.DataLoader(pdata.Bulk(), batch_size=4)]


def test_a_generator_is_drawn_as_dataloader_draws_it_and_resumed_past():
    """With generator=g: each iter() draws from g as DataLoader does (g advances); a resume sets g where the saved
    pass left it, so the passes after it draw what they drew."""
    dataset = pdata.Indexed(9)
    reference = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True,
                                            generator=torch.Generator().manual_seed(4))
    expected = [indices(reference) for _ in range(3)]
    loader = ferry.DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(4))
    it = iter(loader)
    first = [next(it)]
    state = loader.state_dict()
    assert indices(first + list(it)) == expected[0] and [indices(loader) for _ in range(2)] == expected[1:]
    resumed = ferry.DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(99))
    resumed.load_state_dict(state)
    assert [indices(resumed) for _ in range(3)] == [expected[0][1:]] + expected[1:]


def test_what_dataloader_refuses_and_what_ferry_cannot_do():
    with pytest.raises(ConfigError, match="timeout"):  # DataLoader refuses it at iter() without workers
        ferry.DataLoader(pdata.Indexed(), timeout=5)
    with pytest.raises(ConfigError, match="dataset object"):
        ferry.DataLoader("npy-folder", num_workers=1)


def test_dropping_the_loader_stops_its_producers():
    leaks = LeakCheck()
    loader = ferry.DataLoader(pdata.Indexed(6), batch_size=3, num_workers=2, **QUIET)
    assert len(list(loader)) == 2
    del loader
    leaks.assert_clean()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_resumes_mid_pass(num_workers):
    options = dict(batch_size=2, num_workers=num_workers, **QUIET)
    with ferry.DataLoader(pdata.Stream(11), **options) as loader:
        whole = [b.tolist() for b in loader]
        it = iter(loader)
        head = [next(it).tolist() for _ in range(2)]
        state = json.loads(json.dumps(loader.state_dict()))
    with ferry.DataLoader(pdata.Stream(11), **options) as resumed:
        resumed.load_state_dict(state)
        assert head + [b.tolist() for b in resumed] == whole
