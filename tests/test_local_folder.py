"""Acceptance 5 (leftovers): the trainer's private folder goes away when the trainer leaves through Python
(close, exit, KeyboardInterrupt, its own handler's sys.exit), and one left by a trainer killed outright
(SIGKILL, or SIGTERM's default action) is swept at the next start; a folder of a live process, or of no one
we know, never is. No signal handler is installed for this, on any thread."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from ferry import RemoteLoader
from ferry.consumer.local import folder as local_folder

from tests.datasets import PairDataset

from .helpers import REPO, producer_env, wait_for

TRAINER = textwrap.dedent("""
    import signal, sys
    from ferry import RemoteLoader
    if sys.argv[1] == "own-handler":  # the program's own SIGTERM handler, installed before the loader
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    loader = RemoteLoader(dataset="synthetic", dataset_args={"length": 100000, "shape": [2], "delay": 0.01},
                          local_producers=1, batch_size=4, timeout=60)
    it = iter(loader)
    next(it)
    print("READY", loader._local.folder, *loader._local.pids, flush=True)
    while True:
        next(it)
""")


def _start_trainer(mode="plain", tmpdir=None):
    """``tmpdir``: the trainer's TMPDIR (its folder's parent); by default the system's."""
    env = {**producer_env(), **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {})}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, mode], env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = trainer.stdout.readline()  # bounded: the trainer's own timeout=60 ends it if nothing starts
    assert line.startswith("READY"), line + trainer.stderr.read()
    _, folder, *pids = line.split()
    assert os.path.isfile(os.path.join(folder, local_folder.OWNER_FILE))
    return trainer, folder, [int(p) for p in pids]


def _folders_of(pid):
    found = []
    for entry in os.scandir(tempfile.gettempdir()):
        try:
            with open(os.path.join(entry.path, local_folder.OWNER_FILE)) as f:
                if entry.name.startswith("ferry-") and f.read().split()[0] == str(pid):
                    found.append(entry.path)
        except OSError:
            pass
    return found


def _assert_all_gone(trainer, folder, pids):
    assert not os.path.exists(folder), f"{folder} outlived its trainer"
    assert _folders_of(trainer.pid) == []
    for pid in pids:  # they die with their parent (PR_SET_PDEATHSIG); a zombie counts as gone
        wait_for(lambda: local_folder._start_time(pid) is None, 15, f"producer {pid} to exit")


def _stop(trainer, signum):
    try:
        trainer.send_signal(signum)
        rc = trainer.wait(30)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
        trainer.stdout.close()
        stderr = trainer.stderr.read()
        trainer.stderr.close()
    return rc, stderr


@pytest.mark.parametrize("signum,mode,code", [
    (signal.SIGINT, "plain", None),  # KeyboardInterrupt: the loader's finalizer removes it on the way out
    (signal.SIGTERM, "own-handler", 7),  # the program's handler runs, as it would without Ferry; sys.exit
], ids=["sigint", "sigterm-own-handler"])
def test_no_folder_remains_after_a_signal_the_trainer_leaves_through_python_on(signum, mode, code):
    trainer, folder, pids = _start_trainer(mode)
    rc, stderr = _stop(trainer, signum)
    if code is not None:
        assert rc == code, stderr
    _assert_all_gone(trainer, folder, pids)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_folder_of_a_trainer_killed_outright_is_swept_at_the_next_start(signum, tmp_path, monkeypatch):
    # a temp root of its own: a loader that another test starts meanwhile (pytest -n 2) would sweep the dead
    # trainer's folder from the shared one before this test looked at it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    trainer, folder, pids = _start_trainer(tmpdir=tmp_path)
    assert os.path.dirname(folder) == str(tmp_path)
    rc, stderr = _stop(trainer, signum)
    assert rc == -signum, stderr  # SIGTERM's default action: the trainer dies of it, as without Ferry
    assert os.path.isdir(folder)  # nothing of the trainer ran
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 8, "shape": [2]}, local_producers=1,
                      batch_size=4, timeout=30) as loader:
        assert not os.path.exists(folder)
        assert os.path.exists(loader._local.folder)  # its own folder is not a stale one
        assert len(list(loader)) == 2
    _assert_all_gone(trainer, folder, pids)


def _folder(root, name, owner):
    path = root / f"ferry-{name}"
    path.mkdir()
    if owner is not None:
        (path / local_folder.OWNER_FILE).write_text(owner + "\n")
    return path


def test_sweep_takes_only_folders_whose_owner_is_surely_dead(tmp_path):
    child = subprocess.Popen(["sleep", "30"])
    dead = local_folder._identity(child.pid)
    child.kill()
    child.wait(10)
    me = local_folder._identity(os.getpid())
    pid, started, namespace = me.split()
    stale = _folder(tmp_path, "dead", dead)
    reused = _folder(tmp_path, "reused", f"{pid} {int(started) - 1} {namespace}")  # our pid, not our start
    live = _folder(tmp_path, "live", me)
    elsewhere = _folder(tmp_path, "elsewhere", dead.rsplit(" ", 1)[0] + " pid:[1]")  # another pid namespace
    unmarked = _folder(tmp_path, "unmarked", None)
    garbage = _folder(tmp_path, "garbage", "not an owner")
    (live / "keep.txt").write_text("x")
    other = tmp_path / "not-ferry"
    other.mkdir()
    (other / local_folder.OWNER_FILE).write_text(dead)

    swept = local_folder.sweep_stale(str(tmp_path))

    assert sorted(swept) == sorted([str(stale), str(reused)])
    assert not stale.exists() and not reused.exists()
    for kept in (live, elsewhere, unmarked, garbage, other):
        assert kept.is_dir(), kept
    assert (live / "keep.txt").read_text() == "x"


def test_a_made_folder_names_its_owner_and_is_removed():
    folder = local_folder.create()
    try:
        assert os.path.basename(folder).startswith("ferry-")
        with open(os.path.join(folder, local_folder.OWNER_FILE)) as f:
            assert f.read().strip() == local_folder._identity(os.getpid())
    finally:
        local_folder.remove(folder)
    assert not os.path.exists(folder)


def _handlers():
    return {signum: signal.getsignal(signum) for signum in signal.valid_signals()
            if signum not in (signal.SIGKILL, signal.SIGSTOP)}


def _build_use_and_close(seen):
    with RemoteLoader(dataset=PairDataset(length=8), local_producers=1, batch_size=4, timeout=30) as loader:
        seen.append(_handlers())
        assert len(list(loader)) == 2
    seen.append(_handlers())


@pytest.mark.parametrize("where", ["main-thread", "other-thread"])
def test_a_loader_leaves_every_signal_handler_as_it_was(where):
    own = lambda signum, frame: None  # noqa: E731  the program's own handler, to be kept as it is
    previous = signal.signal(signal.SIGUSR1, own)
    try:
        before = _handlers()
        seen = []
        if where == "main-thread":
            _build_use_and_close(seen)
        else:  # where signal.signal cannot be called at all: nothing may be left to undo there either
            failure = []

            def body():
                try:
                    _build_use_and_close(seen)
                except BaseException as exc:
                    failure.append(exc)

            thread = threading.Thread(target=body, name="test-loader-thread")
            thread.start()
            thread.join(60)
            assert not thread.is_alive() and not failure, failure
        assert seen == [before, before]  # while the loader is open, and after it closed
        assert before[signal.SIGUSR1] is own
    finally:
        signal.signal(signal.SIGUSR1, previous)
