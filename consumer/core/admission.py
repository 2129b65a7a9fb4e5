"""Who may feed this consumer: admission of producers, their registry and liveness. No sockets, no clock.

:class:`Peers` decides, over the :class:`~ferry.consumer.core.dispatcher.Dispatcher`'s registry of producers, and
returns what the core must then do (answer WELCOME or REJECT, log, set a lost producer's slots aside). A HELLO is admitted when
* its dataset is the one this consumer serves: its canary samples (ferry.common.canary) hold what the trainer's own
  do, or else what the first announcing producer's did; and the length and fingerprint it was given (``dataset=`` an
  object), or else those of the first producer admitted; with ``dataset=`` a spec string, only producers
  announcing that spec are admitted, and the first of them sets the length and fingerprint (the consumer
  does not build the dataset, which may be costly or need files it does not have; ``dataset_args`` are not
  announced, so they are not compared: the fingerprint tells datasets apart where the dataset defines one).
  Otherwise: a permanent REJECT saying why. A producer is a pool (:mod:`ferry.common.pool`): to one that does
  not announce this consumer's spec (with its arguments, where it opened it for a consumer), the consumer names
  its dataset in a WELCOME and does not register it; its next HELLO announces the named dataset. A producer
  that cannot load it says so in its HELLO (``refused``): a permanent REJECT, kept as ``refused`` for the
  no-producer error.
* Then, by the producer's identity ``(producer id, nonce)``:
  - the same identity on the same routing id: a repeated HELLO, which changes nothing;
  - the same identity on another routing id: the producer reconnected, and keeps the tasks it holds;
  - a new identity: a new registration. An earlier one on this routing id, or of the same producer id, has
    restarted its work: it is lost, and its tasks go back to the front of the queue.

A producer is lost when it says BYE, holds a task longer than ``task_timeout``, or is silent for ``liveness``
heartbeats (:meth:`Peers.expire`). A loss that may be a task's fault charges an attempt to its tasks (the
overdue ones on a timeout, every one it held when it fell silent); see :mod:`ferry.consumer.core.dispatcher`.

*Progress*: ``progress_at`` is when a result last arrived, or when the consumer last owed nothing to
producers (nothing in flight); ``churn`` counts the producers lost since. Producers that keep joining and
leaving without delivering leave ``live`` above zero, but not ``progress_at`` behind: the loader's
no-progress timeout reads both.

:class:`BadPeers` remembers peers that sent invalid messages or talked without a HELLO, so that each is
logged once (and at most INVALID_LOG_BURST lines a minute in all) and told to say HELLO at most once per
heartbeat.

:func:`same_user_ipc` tells a peer that may send pickled values (the loader's own local producers) from every
other: see its docstring.
"""

from __future__ import annotations

import ipaddress
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from ferry.common.canary import Canary, from_wire, mismatch
from ferry.common.constants import MAX_TRACKED_PEERS
from ferry.common.pool import NAME, REJECT, answer_hello

from ferry.consumer.core.dispatcher import Dispatcher, Poisoned, ProducerInfo

__all__ = ["Loss", "Admission", "Peers", "BadPeers", "INVALID_LOG_BURST", "same_user_ipc"]

#: Invalid-message log lines per minute, over all peers.
INVALID_LOG_BURST = 10
_WINDOW_S = 60.0


def same_user_ipc(address: str | None) -> bool:
    """True for a peer connected over ipc whose process runs as this process's user, as the kernel says: ZeroMQ's
    ``Peer-Address`` of an ipc link ends in the peer's ``uid:gid:pid`` (SO_PEERCRED, which the peer cannot
    choose); over tcp it is an IP. The loader's local producers are such peers (its ipc socket lies in a folder
    only its user can open), and such a peer could read this process's files and memory anyway: it may send
    pickled values, as DataLoader's workers do. Any other peer may not (no pickle over the network)."""
    text = (address or "").strip()
    try:
        ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
        return False  # tcp, even over loopback: any local user may connect to a tcp port
    except ValueError:
        pass
    parts = text.rsplit(":", 3)
    return len(parts) == 4 and all(p.isdigit() for p in parts[1:]) and int(parts[1]) == os.getuid()


@dataclass(frozen=True)
class Loss:
    """A producer that was dropped from the registry, and what it held."""

    name: str
    pid: int
    tasks: tuple[int, ...]  # ids of the tasks it held: it may still be writing into their slots
    why: str
    live: int  # producers left registered
    poisoned: tuple[Poisoned, ...] = ()  # seqs whose last attempt this loss was


@dataclass(frozen=True)
class Admission:
    """The answer to one HELLO."""

    name: str  # host:pid
    reject: str | None = None  # not admitted, for good, for this reason
    joined: ProducerInfo | None = None  # a new registration (None: a repeated HELLO or a reconnection)
    losses: tuple[Loss, ...] = ()  # registrations it replaced
    live: int = 0  # producers registered after it
    adopted: str = ""  # this producer's dataset became the consumer's: its length and fingerprint, in words
    naming: bool = False  # a pool producer not serving our dataset yet: WELCOME it naming ours, do not register
    refused: bool = False  # the producer said it cannot load the dataset we named (reject says why)
    warning: str = ""  # admitted, but something to tell the user (another version of the dataset's code)


class Peers:
    def __init__(self, dispatcher: Dispatcher, *, dataset_len: int | None, fingerprint: str | None,
                 shm_token: str | None, now: float, dataset_spec: str | None = None,
                 dataset_args: dict[str, Any] | None = None, canaries: tuple[Canary, ...] | None = None,
                 code: str | None = None) -> None:
        self.dispatcher = dispatcher
        # what a producer's canary samples must match (ferry.common.canary): the trainer's own, or else the first
        # announcing producer's, and whose they are, in words
        self.canaries = list(canaries) if canaries is not None else None
        self._canaries_of = "this trainer's" if canaries is not None else ""
        # the digest of the spec's module source (ferry.common.canary.code_digest): this trainer's copy, or else the
        # first announcing producer's; a producer with another runs other code for the same spec
        self.code = code
        self._code_of = "this trainer's copy" if self.code is not None else ""
        self.dataset_spec = dataset_spec  # admit only producers announcing this spec (pools: named to them)
        self.dataset_args = dict(dataset_args or {})  # named with the spec to pool producers
        self.refused = ""  # the latest producer's refusal to load the dataset we named, in words
        self.rejected = 0  # HELLOs rejected, in all
        self.last_rejection = ""  # the latest, in words: which producer, and why
        self.dataset_len = dataset_len
        self.fingerprint = fingerprint
        self.shard_lengths: list[int] | None = None  # each shard's samples, as the first producer announced them
        self.iterable = False  # the first producer announced an iterable dataset (HELLO dataset.iterable)
        self.iterable_len: int | None = None  # its len(dataset), where it has one
        self._first_name: str | None = None  # the producer whose dataset was adopted
        self._shm_token = shm_token  # of this consumer's shared-memory slab, if it has one
        self.seen = 0  # producers registered, in all
        self.none_since = now  # when the last live producer was lost (or when this began)
        self.progress_at = now  # see the module docstring
        self.churn = 0  # producers lost since progress_at
        self.last_loss = ""  # the latest loss, in words, for the no-progress error

    def progressed(self, now: float) -> None:
        """A result arrived, or nothing is owed: producers are not merely coming and going."""
        self.progress_at, self.churn = now, 0

    @property
    def dataset_known(self) -> bool:
        return self.dataset_len is not None and self.fingerprint is not None

    def admit(self, peer: bytes, hello: dict[str, Any], now: float) -> Admission:
        """Decide on a HELLO from ``peer`` and apply it to the registry."""
        name = f"{hello['host']}:{hello['pid']}"
        known = self.dataset_known
        verdict, why = answer_hello(hello, self.dataset_spec, self.dataset_args)  # common/pool.py
        if verdict == REJECT:
            if "refused" in hello:
                self.refused = f"producer {name}: {hello['refused']}"
            return self._reject(name, why, refused="refused" in hello)
        if verdict == NAME:
            return Admission(name, naming=True)
        reason = self._check_dataset(hello["dataset"], name)
        if reason is not None:
            return self._reject(name, reason)
        dataset = hello["dataset"]
        warning = self._check_code(dataset, name)
        adopted = "" if known else (f"{dataset['len']} samples, fingerprint {dataset['fingerprint']!r}, "
                                    f"spec {dataset['spec']!r}")
        identity = (hello["producer"], hello["nonce"])
        current = self.dispatcher.producers.get(peer)
        if current is not None and current.identity == identity:
            return Admission(name, live=len(self.dispatcher.producers), adopted=adopted)  # repeated: change nothing
        losses: list[Loss | None] = []
        moved = self.dispatcher.find_identity(identity)
        joined = None
        if moved is not None:  # reconnected under a new routing id, same work in hand
            if current is not None:
                losses.append(self.lose(peer, "replaced by a reconnection", now))
            self.dispatcher.move(moved.peer, peer)
        else:
            if current is not None:
                losses.append(self.lose(peer, "restarted its work (new HELLO)", now))
            for other in list(self.dispatcher.producers.values()):
                if other.producer_id == hello["producer"]:
                    losses.append(self.lose(other.peer, "restarted its work (new HELLO)", now))
            joined = ProducerInfo(
                peer=peer, producer_id=hello["producer"], nonce=hello["nonce"], name=name, slots=hello["slots"],
                last_heard=now, joined=now, shared=self._shm_token is not None and hello.get("shm") == self._shm_token,
                pid=hello["pid"], worker=tuple(hello["worker"]) if "worker" in hello else None,
                tasks_per_message=hello.get("tasks", 1), ahead=hello.get("ahead", 0),
                serial=hello.get("serial", False),
            )
            self.dispatcher.add(joined)
            self.seen += 1
        return Admission(name, joined=joined, losses=tuple(loss for loss in losses if loss is not None),
                         live=len(self.dispatcher.producers), adopted=adopted, warning=warning if joined else "")

    def _check_code(self, dataset: dict[str, Any], name: str) -> str:
        """A warning when the producer's code for the spec differs from the reference's (its samples agree, or it
        would have been refused), or ""."""
        code = dataset.get("code")
        if code is None:
            return ""
        if self.code is None:
            self.code, self._code_of = code, f"the first producer's ({name})"
            return ""
        if code == self.code:
            return ""
        return (f"producer {name} runs other code for dataset {dataset['spec']!r} than {self._code_of} (the "
                "module's source differs): a producer left from another version? Its canary samples agree, so it "
                "is admitted; restart it with this version to be sure")

    def _reject(self, name: str, why: str, refused: bool = False) -> Admission:
        self.rejected += 1
        self.last_rejection = f"producer {name}: {why}"
        return Admission(name, reject=why, refused=refused)

    def _check_dataset(self, dataset: dict[str, Any], name: str) -> str | None:
        """Why ``dataset`` is not the one served here, or None (the first one known becomes the one)."""
        first = self._first_name
        if self.dataset_spec is not None and dataset["spec"] != self.dataset_spec:
            return (f"this producer serves dataset {dataset['spec']!r}, but the consumer was given "
                    f"dataset={self.dataset_spec!r}")
        if self.dataset_len is not None and dataset["len"] != self.dataset_len:
            return (f"dataset length {dataset['len']} (spec {dataset['spec']!r}) differs from this consumer's "
                    f"{self.dataset_len}" + (f" (first producer {first})" if first else ""))
        if self.fingerprint is not None and dataset["fingerprint"] != self.fingerprint:
            return (f"dataset fingerprint {dataset['fingerprint']!r} (spec {dataset['spec']!r}) differs from "
                    f"{self.fingerprint!r}" + (f" of the first producer {first}" if first else "")
                    + _module_hint(dataset["fingerprint"], self.fingerprint))
        announced = dataset.get("canary")
        if announced is not None:  # a remote producer's samples (a loader's own local producers announce none)
            if self.canaries is None:
                self.canaries, self._canaries_of = from_wire(announced), f"the first producer's ({name})"
            else:
                reason = mismatch(self.canaries, from_wire(announced), self._canaries_of)
                if reason is not None:
                    return f"its data differs: {reason}"
        lengths = dataset.get("shard_lens")
        if lengths is not None and self.shard_lengths is not None and lengths != self.shard_lengths:
            return (f"its shards hold other sample counts than the first producer's{f' ({first})' if first else ''}, "
                    f"under the same fingerprint {dataset['fingerprint']!r}: has a shard been rewritten?")
        if self.shard_lengths is None:
            self.shard_lengths = lengths
        if not self.dataset_known and dataset.get("iterable") is True:
            self.iterable, self.iterable_len = True, dataset["len"] if dataset.get("sized", True) else None
        if not self.dataset_known:
            self.dataset_len, self.fingerprint, self._first_name = dataset["len"], dataset["fingerprint"], name
        return None

    def lose(self, peer: bytes, why: str, now: float, *, charge: bool = False,
             charged: set[int] | None = None) -> Loss | None:
        """Drop ``peer``'s registration; its tasks go back to the front of the queue. None if not registered.

        With ``charge``, each task it held (or those in ``charged``) costs an attempt, for ``why``."""
        held = self.dispatcher.producers.get(peer)
        tasks = tuple(held.in_flight) if held is not None else ()
        info = self.dispatcher.lose(peer, why if charge else None, charged)
        if info is None:
            return None
        if not self.dispatcher.producers:
            self.none_since = now
        self.churn += 1
        self.last_loss = f"producer {info.name} {why}"
        return Loss(info.name, info.pid, tasks, why, len(self.dispatcher.producers),
                    tuple(self.dispatcher.take_poisoned()))

    def expire(self, now: float, *, heartbeat: float, liveness: int,
               task_timeout: float) -> tuple[list[Loss], list[bytes]]:
        """Lose the producers that held a task too long or fell silent. Returns those losses and the peers
        still registered, to be pinged."""
        losses = [self.lose(peer, f"held a task for more than task_timeout={task_timeout:g} s", now, charge=True,
                            charged=overdue)
                  for peer, overdue in self.dispatcher.overdue_tasks(now - task_timeout).items()]
        deadline = now - liveness * heartbeat
        ping = []
        for info in list(self.dispatcher.producers.values()):
            if info.last_heard < deadline:
                losses.append(self.lose(info.peer, f"silent for {now - info.last_heard:.1f} s", now, charge=True))
            else:
                ping.append(info.peer)
        return [loss for loss in losses if loss is not None], ping

    def figures(self, now: float) -> dict[str, dict[str, Any]]:
        """Per producer (by name): batches and bytes received, tasks in flight, slots, tasks it takes ahead of them,
        the most tasks it holds at once (``window``: slots and ahead, at most MAX_SLOTS), whether it loads one
        sample at a time (a user's dataset class, no ``--threads``), whether it runs on another machine (neither
        shared memory, ipc nor loopback), seconds since it joined, its batches per second since then (a slow one among fast ones stands out), seconds since it was last heard
        (a frozen one stands out before the liveness window drops it)."""
        return {p.name: {"batches": p.batches, "bytes": p.bytes, "in_flight": len(p.in_flight), "slots": p.slots,
                         "ahead": p.ahead, "window": p.window, "serial": p.serial, "remote": p.remote,
                         "joined_s": now - p.joined,
                         "batches_per_s": p.batches / (now - p.joined) if now > p.joined else 0.0,
                         "silent_s": max(0.0, now - p.last_heard)}
                for p in self.dispatcher.producers.values()}

    def describe(self, peer: bytes) -> str:
        info = self.dispatcher.producers.get(peer)
        return f"producer {info.name}" if info else f"peer {peer.hex()}"


class BadPeers:
    """Peers that sent an invalid message or talked without a HELLO (the newest MAX_TRACKED_PEERS of them)."""

    def __init__(self, describe: Callable[[bytes], str]) -> None:
        self._describe = describe
        self._peers: OrderedDict[bytes, float] = OrderedDict()  # peer -> when it was last sent a REJECT
        self._window_start = -_WINDOW_S
        self._lines = 0  # logged in the current window
        self._suppressed = 0  # left out in the current window

    def invalid(self, peer: bytes, reason: str, now: float) -> list[str]:
        """The lines to log (WARNING) for an invalid message from ``peer``: one for its first, and at most
        INVALID_LOG_BURST a minute in all (a broken peer that keeps reconnecting gets a new routing id each
        time); past the burst, calls are counted and said in one line when the next window starts."""
        if peer in self._peers:
            return []
        self._remember(peer, 0.0)
        lines = []
        if now - self._window_start >= _WINDOW_S:
            if self._suppressed:
                lines.append(f"{self._suppressed} more invalid messages from other peers were dropped without a log line")
            self._window_start, self._lines, self._suppressed = now, 0, 0
        if self._lines >= INVALID_LOG_BURST:
            self._suppressed += 1
            return lines
        self._lines += 1
        lines.append(f"invalid message from {self._describe(peer)} dropped: {reason} (further ones from this peer "
                     f"are only counted)")
        return lines

    def reject_due(self, peer: bytes, now: float, interval: float) -> bool:
        """Whether to tell an unregistered ``peer`` to say HELLO: at most once per ``interval``."""
        if now - self._peers.get(peer, -1e9) < interval:
            return False
        self._remember(peer, now)
        return True

    def _remember(self, peer: bytes, when: float) -> None:
        self._peers[peer] = when
        self._peers.move_to_end(peer)
        while len(self._peers) > MAX_TRACKED_PEERS:
            self._peers.popitem(last=False)


def _module_hint(theirs: str, ours: str) -> str:
    """What to do when two fingerprints name the same class and length under two module names; else ""."""
    (their_name, _, their_rest), (our_name, _, our_rest) = theirs.partition(":"), ours.partition(":")
    if their_rest != our_rest or their_name.rpartition(".")[2] != our_name.rpartition(".")[2]:
        return ""
    module = our_name.rpartition(".")[0]
    if module == "__main__":  # defined interactively: no module a producer could import
        return (": the same class under two module names; a class defined interactively (no script file) has no "
                "name a producer can import: move it into a module, or give the class a fingerprint attribute")
    return (f": the same class under two module names. Start the producer with the module {module!r} (a class "
            "of the training script is named by the script: --dataset SCRIPT:CLASS, the script importable in the "
            "producer's working directory or PYTHONPATH), or give the class a fingerprint attribute")
