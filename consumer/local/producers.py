"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes that a RemoteLoader starts, owns, replaces
and stops: N of them, or with ``local_producers="auto"`` as many as the training loop needs.

They connect over ``ipc://`` to a socket in a private temporary folder (:mod:`ferry.consumer.local.folder`:
removed on close and at exit, and swept by the next trainer after a death that runs no Python).
:mod:`ferry.consumer.local.launchers` starts one: a subprocess for a dataset spec, a daemonic
``multiprocessing`` process for a dataset object.

One thread, ``ferry-local-watch`` (:mod:`ferry.consumer.local.watch`), owns the processes: it starts every one,
copies their error output, sees each death at once, starts replacements and, under ``"auto"``, starts and stops
producers to the count :meth:`LocalProducers.scale_to` was given (by :mod:`ferry.consumer.local.autoscale`, on the
training thread). Which process holds which place, and what is planned for each, is :mod:`.members`, changed
under one lock. When every local producer is dead and none is due for replacement, :meth:`check` raises in the
training thread: :class:`ProducerStartupError` if none of them ever served, else :class:`ProducerDiedError`.

Shutdown order (``close``): mark the set as closing (no replacement nor start from then on; exits are expected,
not reported); stop the watch thread (its end sends the producers it started their SIGTERM, through
``PR_SET_PDEATHSIG``); SIGTERM every producer, those asked to stop earlier included (it says BYE and exits 0),
wait, SIGKILL stragglers; copy what is left in the pipes; close the pipes and files; remove the folder; close the
slab last.

With ``shared_memory=(slots, slot_bytes)`` this object also owns the :class:`ferry.common.shm.Slab` that its
producers write batches into (see :mod:`ferry.common.shm`), and closes it last.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ferry.common import shm
from ferry.common.constants import (JOIN_TIMEOUT_S, RESPAWN_FIRST_DELAY_S, RESPAWN_MAX_DELAY_S, RESPAWN_WINDOW_S,
                                    RESPAWNS_PER_WINDOW)
from ferry.common.errors import ProducerDiedError, ProducerStartupError

from ferry.consumer.local import folder as local_folder
from ferry.consumer.local.children import reports
from ferry.consumer.local.autoscale import count_bounds
from ferry.consumer.local.launchers import ObjectLauncher, SpecLauncher, producer_config
from ferry.consumer.local.members import Members
from ferry.consumer.local.respawn import Replacements, RespawnBudget
from ferry.consumer.local.watch import Watch
from ferry.consumer.options import LocalOptions, TransportOptions

log = logging.getLogger("ferry.consumer")


class LocalProducers:
    """Producer processes on this machine: a fixed count, or between ``low`` and ``high`` of them; see the module
    docstring."""

    def __init__(self, local: LocalOptions, transport: TransportOptions, dataset: Any, *,
                 dataset_args: dict[str, Any] | None, shared_memory: tuple[int, int] | None = None,
                 base_seed: int | None = None) -> None:
        """``local.count`` producers of ``dataset`` (``"auto"``: ``local.min`` to begin with, default 1),
        configured by the options they share with the loader.

        Args:
            shared_memory: ``(slots, slot_bytes)`` of the slab to create, or None for none.
            base_seed: producer i seeds its random streams with ``base_seed + i``, as DataLoader's workers do
                (a replacement, or a restart after a scale-down: see ``ferry.common.sampleinfo.producer_seed``).

        Raises:
            ConfigError: a producer hook that is not a spec with a dataset spec.
            Exception: what starting a producer raised (the others are stopped first).
        """
        self.base_seed = base_seed
        self.folder = local_folder.create()
        self.endpoint = f"ipc://{self.folder}/consumer.sock"
        self.low, self.high = count_bounds(local)  # equal for a fixed count
        self.slab: shm.Slab | None = None
        self._lock = threading.Lock()  # guards _members and the children's exit codes
        self._members = Members(self.low, self.high, Replacements(RespawnBudget(
            limit=RESPAWNS_PER_WINDOW, window=RESPAWN_WINDOW_S, first_delay=RESPAWN_FIRST_DELAY_S,
            max_delay=RESPAWN_MAX_DELAY_S)))
        self._watch: Watch | None = None  # built once the launcher is: None only while this constructor fails
        #: called from the watch thread with (pid, why) for each death it sees, so that the io thread loses
        #: that producer at once instead of after the liveness window; set by the pipeline
        self.on_death: Callable[[int, str], None] | None = None
        #: called from the watch thread with the pid of a producer about to be asked to stop (a scale-down); it
        #: returns once the io thread has let that producer go (bounded); set by the pipeline
        self.on_leave: Callable[[int], Any] | None = None
        #: whether any producer has served this loader yet (set by the pipeline): until then a death is a
        #: start-up failure, reported and not replaced
        self.served: Callable[[], bool] = lambda: False
        try:
            if shared_memory is not None and shm.available():
                try:
                    self.slab = shm.Slab(*shared_memory)
                except OSError as exc:  # e.g. a seccomp profile without memfd_create: the socket still works
                    log.warning("no shared memory for local producers (%s); batches go over the socket", exc)
            config = producer_config(local, transport, dataset, dataset_args, endpoint=self.endpoint,
                                     slab=self.slab, num_workers=self.high)
            launcher = (SpecLauncher(self.folder, config, base_seed=base_seed) if isinstance(dataset, str)
                        else ObjectLauncher(self.folder, config, dataset, mp_context=local.mp_context,
                                            base_seed=base_seed))
            self._watch = Watch(launcher, self._lock, self._members, hooks=self)
            self._watch.start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The current process of each producer, in index order (a replacement takes its producer's place)."""
        with self._lock:
            return [child.pid for child in self._members.current()]

    @property
    def count(self) -> int:
        """How many producers the set has (live, or dead: due for replacement or left dead by the bound)."""
        with self._lock:
            return len(self._members.children)

    def scale_to(self, count: int) -> None:
        """From any thread: have ``count`` producers (within ``low`` and ``high``). The watch thread starts or
        stops the difference at once."""
        with self._lock:
            self._members.scale_to(count)
        if self._watch is not None:
            self._watch.wake()

    def check(self, *, served: bool = False) -> None:
        """From the training thread: raise if every local producer has exited and none is due for replacement.

        Args:
            served: whether any producer has ever joined this loader (then a death is mid-run).

        Raises:
            ProducerStartupError: all exited and none ever served.
            ProducerDiedError: all exited after serving, and none will be replaced.
        """
        members = self._members
        if self._watch is not None and not self._watch.thread.is_alive():
            # it failed: read the exit codes here; nothing replaces them
            self._watch.note_deaths(replace=False)
            with self._lock:
                members.replacements.clear()
        with self._lock:
            children = members.current()
            if (not children or members.closing or members.replacements.pending
                    or any(c.exit_code is None for c in children)):
                return
            text = reports(children)
            bound = members.replacements.bound_note()
        who = "the local producer" if len(children) == 1 else f"all {len(children)} local producers"
        if all(child.stopped_from_outside() for child in children):  # not a failure: someone else stopped them
            raise ProducerDiedError(f"{who} {'was' if len(children) == 1 else 'were'} stopped from outside this "
                                    f"loader{' mid-run' if served else ''}, and a producer stopped so is not "
                                    f"replaced:\n{text}")
        if served:
            raise ProducerDiedError(f"{who} died mid-run{bound}:\n{text}")
        raise ProducerStartupError(f"{who} exited before serving:\n{text}")

    def close(self) -> None:
        with self._lock:
            self._members.closing = True
            self._members.replacements.clear()
        if self._watch is not None:
            self._watch.stop(JOIN_TIMEOUT_S)
            if not self._watch.thread.is_alive():
                # the watch refers back to this object (its hooks): let go of it, so that the pair, and the
                # launcher with the user's dataset, are freed when the loader is, not at the next gc
                self._watch = None
        with self._lock:
            children = self._members.every()
        for child in children:
            child.signal_stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait(JOIN_TIMEOUT_S)
        for child in children:
            child.pump()  # what they wrote as they stopped
            child.release()
        with self._lock:
            self._members.children.clear()
            self._members.retiring.clear()
        local_folder.remove(self.folder)
        if self.slab is not None:
            self.slab.close()
