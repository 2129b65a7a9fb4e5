"""Scenario 7: compression for slow links (issue 12, part 3; issue 17, part 4). ``python -m benchmarks --only 7``.

Every row is Ferry with ``compression="auto"`` against ``compression=None``, side by side in one run: each
system has its own loader(s) and producer(s); both are warmed together, epoch by epoch (the warm-up is
reported too: it holds epoch 0 and the first trials of "auto"), then they alternate, each measured first in
half of the rounds.

* a 1 Gbit/s link (a veth pair to a network namespace, shaped with ``tc tbf``), compressible tiles
  (whole-number float32, like satellite counts): auto should turn compression on (target ≥ 1.8× None);
* the same link, with two loaders on the same trainer taking turns of 6 s each (``Sizes.turn_s``; whole
  epochs, as a train and a validation loader alternate), each with its own producer over that link: the same
  target, so a loader paused while the other has its turn must not mislead "auto";
* the same link with incompressible bytes; a veth pair without shaping, tcp loopback and local producers
  over ipc, with the tiles: auto must cost nothing (target ≥ 0.95×). On loopback and ipc "auto" never
  compresses, so both systems run the same code and the ratio shows the noise of this machine.

Remote producers run in the namespace (``ip netns exec``), the loaders here. Needs root and ``tc``; without
them the veth rows say why they were skipped.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable

import numpy as np

from ferry import RemoteLoader

from .harness import Figure, Report, Row, ratio
from .scenarios import Producers, free_port, wait_producers

BATCH = 32
#: Each system's warm-up before the alternating measurements: at least this many epochs, and whole epochs for
#: at least ``Sizes.turn_s`` seconds. "auto" measures its first codec and runs its first trials in it (a rate
#: needs 0.5 s of batches while the loop waits; then come the batches asked before the change, then 0.5 s
#: more).
WARM_EPOCHS = 4


class Tiles:
    """Sample i: a float32 tile of whole numbers 0..4095 (smooth, like sensor counts), cycling through a few
    precomputed ones so that loading costs only a copy. Compresses about 2-3x after the byte shuffle."""

    def __init__(self, length: int = 512, shape=(13, 128, 128), variants: int = 16) -> None:
        self.length, self.shape = int(length), tuple(shape)
        rng = np.random.default_rng(0)
        steps = rng.integers(-6, 7, size=(variants, *self.shape))
        self._tiles = (np.cumsum(steps, axis=-1) % 4096).astype(np.float32)
        self.fingerprint = f"bench-tiles:{self.length}:{self.shape}:{variants}"

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self._tiles[index % len(self._tiles)].copy(), index


class Noise(Tiles):
    """Like Tiles, but random bytes of the same size: incompressible."""

    def __init__(self, length: int = 512, shape=(13, 128, 128), variants: int = 16) -> None:
        super().__init__(length, shape, 1)
        rng = np.random.default_rng(1)
        self._tiles = rng.integers(0, 256, size=(variants, *self.shape, 4), dtype=np.uint8).view(np.float32)[..., 0]
        self.fingerprint = f"bench-noise:{self.length}:{self.shape}:{variants}"


class Decisions(logging.Handler):
    """The consumer's "auto" decisions (logged at INFO) while a row runs, summed up in a few words each. The
    logger's other records reach the root handlers as they would without it (at the root's level)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._logger = logging.getLogger("ferry.consumer")
        self._saved = (self._logger.level, self._logger.propagate)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("compression: "):
            self.lines.append(message)
        root = logging.getLogger()
        if record.levelno >= root.getEffectiveLevel():
            root.handle(record)

    def __enter__(self) -> "Decisions":
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]

    def summary(self) -> str:
        words = []
        for line in self.lines:
            text = line[len("compression: "):]
            if text.startswith("trying "):
                words.append(f"tried {text.split()[1]}")
            elif " kept" in text:
                words.append(f"kept {text.split()[0]}")
            elif text.startswith("back to "):
                words.append(f"back to {text.split()[2].rstrip(':')}")
        return "auto: " + (", ".join(words) if words else "no trial")


def alternate(systems: dict[str, Callable[[], float]], repeats: int) -> dict[str, Figure]:
    """Run each system ``repeats`` times, in rounds whose order flips every time (A B, B A, A B, ...): on this
    shared machine a system measured first in every round was measured up to 25 % apart from the same code
    measured second (loopback, where both systems run the same code)."""
    figures = {name: Figure() for name in systems}
    for round_ in range(repeats):
        for name in (list(systems) if round_ % 2 == 0 else list(reversed(systems))):
            figures[name].values.append(systems[name]())
    return figures


# --- the systems ---------------------------------------------------------------------------------------------
class Systems:
    """Loaders (and the producers they need) by name, closed together."""

    def __init__(self) -> None:
        self.loaders: dict[str, RemoteLoader] = {}
        self._producers: list[Producers] = []

    def remote(self, name: str, compression: str | None, host: str, netns: str | None, spec: str,
               args: dict[str, Any]) -> None:
        """A loader bound on ``host``, with one producer of ``spec`` in ``netns`` (here if None)."""
        endpoint = f"tcp://{host}:{free_port()}"
        self.loaders[name] = RemoteLoader(endpoint=endpoint, batch_size=BATCH, compression=compression,
                                          buffer_batches=8, heartbeat=0.2, no_producer_timeout=120, log_every=None)
        producers = Producers(endpoint)
        self._producers.append(producers)
        producers.add(1, spec, args, threads=2, slots=3, netns=netns)

    def local(self, name: str, compression: str | None, dataset: Any) -> None:
        """A loader with one local producer, over its ipc socket (shared memory off)."""
        self.loaders[name] = RemoteLoader(dataset=dataset, local_producers=1, producer_threads=2, producer_slots=3,
                                          shared_memory=False, batch_size=BATCH, compression=compression,
                                          buffer_batches=8, no_producer_timeout=120, log_every=None)

    def ready(self) -> None:
        for each in self.loaders.values():
            wait_producers(each, 1)

    def close(self) -> None:
        for each in self.loaders.values():
            each.close()
        for each in self._producers:
            each.close()


def _rate(loader: RemoteLoader, epochs: int, seconds: float) -> float:
    """Whole epochs, at least ``epochs`` of them and ``seconds``; samples per second over them."""
    samples, began, done = 0, time.perf_counter(), 0
    while done < epochs or time.perf_counter() - began < seconds:
        for batch in loader:
            samples += len(batch[1])
        done += 1
    return samples / (time.perf_counter() - began)


def _warm(loaders: dict[str, RemoteLoader], seconds: float) -> dict[str, float]:
    """Warm the loaders together: one epoch each in rounds whose order flips, until each has run at least
    WARM_EPOCHS epochs and ``seconds`` of its own. Returns each one's samples per second (epoch 0 included).

    Not one after the other: on this machine the loader warmed first then ran about 20 % slower than the
    other over loopback, whatever it ran (``None`` against ``None``, 27 MB batches; gone with
    ``MALLOC_ARENA_MAX=1``, both at the slower rate: which glibc arena each one's receiving thread got)."""
    samples = {name: 0 for name in loaders}
    spent = {name: 0.0 for name in loaders}
    epochs = {name: 0 for name in loaders}
    order = list(loaders)
    while any(epochs[n] < WARM_EPOCHS or spent[n] < seconds for n in order):
        for name in order:
            began = time.perf_counter()
            for batch in loaders[name]:
                samples[name] += len(batch[1])
            spent[name] += time.perf_counter() - began
            epochs[name] += 1
        order.reverse()
    return {name: samples[name] / spent[name] for name in loaders}


def _side_by_side(build: Callable[[Systems, tuple[str, ...]], None], repeats: int,
                  warm_s: float) -> tuple[dict[str, Figure], dict[str, Any], str]:
    """Loaders "auto" and "none" built by ``build`` (given the order to build them in), in two halves that build
    them in either order (the loader built first ran up to 25 % apart from the other here, whatever it ran: see
    :func:`_warm`). In each half: warmed together for ``warm_s`` (each rate reported as "<name> warm-up";
    epoch 0 included), then ``repeats / 2`` alternating rounds, each measurement whole epochs for at least a
    quarter of ``warm_s`` (an epoch over loopback lasts 0.1 s: too short to time on a shared machine).
    Returns (figures of both halves, auto's stats summed, its decisions per half)."""
    figures = {name: Figure() for name in ("auto", "none")}
    warm = {f"{name} warm-up": Figure() for name in ("auto", "none")}
    stats = {"compressed_bytes": 0, "uncompressed_bytes": 0}
    said = []
    for order in (("auto", "none"), ("none", "auto")):
        systems = Systems()
        try:
            with Decisions() as decisions:
                build(systems, order)
                systems.ready()
                for name, rate in _warm(systems.loaders, warm_s).items():
                    warm[f"{name} warm-up"].values.append(rate)
                half = alternate({name: (lambda l=systems.loaders[name]: _rate(l, 1, warm_s / 4)) for name in order},
                                 max(1, repeats // 2))
            for name, figure in half.items():
                figures[name].values.extend(figure.values)
            auto = systems.loaders["auto"].stats()
            for key in stats:
                stats[key] += auto[key]
            said.append(f"{order[0]} built first: {ratio(half['auto'], half['none']):.2f}, {decisions.summary()}")
        finally:
            systems.close()
    return {**figures, **warm}, stats, "; ".join(said)


def _turns(loaders: list[RemoteLoader], turn_s: float) -> float:
    """One round: each loader in turn iterates whole epochs for at least ``turn_s``. Samples per second in all."""
    samples, began = 0, time.perf_counter()
    for loader in loaders:
        turn = time.perf_counter()
        while time.perf_counter() - turn < turn_s:
            for batch in loader:
                samples += len(batch[1])
    return samples / (time.perf_counter() - began)


def _taking_turns(host: str, netns: str, spec: str, args: dict[str, Any], repeats: int,
                  turn_s: float) -> tuple[dict[str, Figure], dict[str, Any], str]:
    """A train and a validation loader per system, taking turns; the systems alternate round by round."""
    systems = Systems()
    try:
        with Decisions() as decisions:
            for system, compression in (("auto", "auto"), ("none", None)):
                for role in ("train", "val"):
                    systems.remote(f"{system} {role}", compression, host, netns, spec, args)
            systems.ready()
            pairs = {system: [systems.loaders[f"{system} train"], systems.loaders[f"{system} val"]]
                     for system in ("auto", "none")}
            warm = {f"{system} first round": Figure([_turns(pair, turn_s)]) for system, pair in pairs.items()}
            figures = alternate({system: (lambda p=pair: _turns(p, turn_s)) for system, pair in pairs.items()},
                                repeats)
        stats = systems.loaders["auto train"].stats()
        return {**figures, **warm}, stats, decisions.summary()
    finally:
        systems.close()


# --- rows ----------------------------------------------------------------------------------------------------
def _link(tag: str, rate: str | None) -> Any:
    """A veth link to a fresh namespace, shaped to ``rate`` (None: unshaped); or a string saying why there is
    none."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    if shutil.which("tc") is None or shutil.which("ip") is None:
        return "needs iproute2 (ip, tc)"
    try:
        from tests.netns import ShapedLink

        return ShapedLink(tag, rate=rate)
    except Exception as exc:  # noqa: BLE001 - any failure to build the link skips the row, saying why
        return f"cannot build a veth link here: {exc}"


def _row(report: Report, case: str, figures: dict[str, Figure], stats: dict[str, Any], decisions: str,
         target: float, sample_mb: float, unit: str = "samples/s") -> None:
    r = ratio(figures["auto"], figures["none"])
    wire, raw = stats.get("compressed_bytes", 0), stats.get("uncompressed_bytes", 0)
    on = f"auto compressed {raw / 1e6:.0f} MB into {wire / 1e6:.0f} MB" if wire else "auto sent raw"
    shown = {f"{name} {unit}": figure.text() for name, figure in figures.items()}
    shown["auto MB/s"] = f"{figures['auto'].median * sample_mb:.0f}"
    shown["none MB/s"] = f"{figures['none'].median * sample_mb:.0f}"
    report.add(Row("7 compression", case, shown, ratio=r, target=f"auto / none ≥ {target}", met=r >= target,
                   note=f"{on}; {decisions}", raw={k: figures[k].values for k in ("auto", "none")}))


def compression_scenario(report: Report, sizes: Any) -> None:
    length = max(4 * BATCH, sizes.seed_samples * 2)
    shape = list(sizes.seed_shape[:1]) + [128, 128] if len(sizes.seed_shape) == 3 else [13, 128, 128]
    args = {"length": length, "shape": shape}
    sample_mb = float(np.prod(shape)) * 4 / 1e6
    tiles, noise = "benchmarks.compression:Tiles", "benchmarks.compression:Noise"
    repeats = 2 * sizes.repeats  # in two halves, each system measured first in half of each half's rounds
    rounds = 2 * ((sizes.repeats + 1) // 2)  # of the turn-taking row, whose rounds are long
    warm_s = sizes.turn_s

    def remote_pair(host: str, ns: str | None, spec: str) -> Callable[[Systems, tuple[str, ...]], None]:
        def build(systems: Systems, order: tuple[str, ...]) -> None:
            for name in order:
                systems.remote(name, "auto" if name == "auto" else None, host, ns, spec, args)
        return build

    def local_pair(systems: Systems, order: tuple[str, ...]) -> None:
        dataset = Tiles(length, tuple(shape))
        for name in order:
            systems.local(name, "auto" if name == "auto" else None, dataset)

    shaped_cases = ("1 Gbit/s tbf-shaped veth link, compressible float32 tiles",
                    "1 Gbit/s link, two loaders taking 6 s turns (train / validation), compressible tiles",
                    "1 Gbit/s tbf-shaped veth link, incompressible bytes")
    link = _link("bench", "1gbit")
    try:
        if isinstance(link, str):
            for case in shaped_cases:
                report.add(Row("7 compression", case, {}, note=f"skipped: {link}"))
        else:
            figures, stats, said = _side_by_side(remote_pair(link.addr_here, link.ns, tiles), repeats, warm_s)
            _row(report, shaped_cases[0], figures, stats, said, 1.8, sample_mb)
            figures, stats, said = _taking_turns(link.addr_here, link.ns, tiles, args, rounds, sizes.turn_s)
            _row(report, shaped_cases[1], figures, stats, said, 1.8, sample_mb)
            figures, stats, said = _side_by_side(remote_pair(link.addr_here, link.ns, noise), repeats, warm_s)
            _row(report, shaped_cases[2], figures, stats, said, 0.95, sample_mb)
    finally:
        if not isinstance(link, str):
            link.close()
    link = _link("bvet", None)
    try:
        case = "veth pair without shaping, compressible float32 tiles"
        if isinstance(link, str):
            report.add(Row("7 compression", case, {}, note=f"skipped: {link}"))
        else:
            figures, stats, said = _side_by_side(remote_pair(link.addr_here, link.ns, tiles), repeats, warm_s)
            _row(report, case, figures, stats, said, 0.95, sample_mb)
    finally:
        if not isinstance(link, str):
            link.close()
    figures, stats, said = _side_by_side(remote_pair("127.0.0.1", None, tiles), repeats, warm_s)
    _row(report, "tcp loopback, compressible float32 tiles", figures, stats, said, 0.95, sample_mb)
    figures, stats, said = _side_by_side(local_pair, repeats, warm_s)
    _row(report, "local producers over ipc (shared memory off), compressible float32 tiles", figures, stats, said,
         0.95, sample_mb)
