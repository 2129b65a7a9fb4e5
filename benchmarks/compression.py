"""Scenario 7: compression for slow links (issue 12, part 3). ``python -m benchmarks --only 7``.

Two rows, each Ferry with ``compression="auto"`` against ``compression=None``, measured alternating:

* a 1 Gbit/s link (a veth pair to a network namespace, shaped with ``tc tbf``), compressible tiles (whole-number
  float32, like satellite counts): auto should turn compression on (target ≥ 1.8× the samples/s of None);
* the same link with incompressible bytes, and tcp loopback with the tiles: auto should stay off and cost
  nothing (target ≥ 0.95×).

The producer runs in the namespace (``ip netns exec``), the loader here. Needs root and ``tc``; without them
the rows say why they were skipped.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np

from ferry import RemoteLoader

from .harness import Figure, Report, Row, alternate, ratio
from .scenarios import Producers, epoch_rate, free_port, wait_producers

BATCH = 32
#: "auto" (producer/compressing.py) tries a codec from its 12th task on and judges the trial by about the 32nd:
#: the warm-up epochs (of 8 batches at --quick) cover both, so that the alternating epochs measure the outcome.
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


def _auto_vs_none(host: str, netns: str | None, spec: str, args: dict[str, Any], repeats: int) -> tuple[dict, dict]:
    """Two loaders, each with its own producer, warmed, then alternating epochs. Returns (figures, auto's stats)."""
    producers: list[Producers] = []
    loaders: dict[str, RemoteLoader] = {}
    try:
        for name, compression in (("auto", "auto"), ("none", None)):
            endpoint = f"tcp://{host}:{free_port()}"
            loaders[name] = RemoteLoader(endpoint=endpoint, batch_size=BATCH, compression=compression,
                                         buffer_batches=8, heartbeat=0.2, no_producer_timeout=120, log_every=None)
            producers.append(Producers(endpoint))
            producers[-1].add(1, spec, args, threads=2, slots=3, netns=netns)
        for each in loaders.values():
            wait_producers(each, 1)
        for each in loaders.values():
            epoch_rate(each, BATCH, epochs=WARM_EPOCHS)
        figures = alternate({name: (lambda l=each: epoch_rate(l, BATCH, epochs=1)) for name, each in loaders.items()},
                            repeats)
        return figures, loaders["auto"].stats()
    finally:
        for each in loaders.values():
            each.close()
        for each in producers:
            each.close()


def _shaped_link(rate: str) -> Any:
    """A veth link to a fresh namespace, shaped to ``rate``; or a string saying why there is none."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    if shutil.which("tc") is None or shutil.which("ip") is None:
        return "needs iproute2 (ip, tc)"
    try:
        from tests.netns import ShapedLink

        return ShapedLink("bench", rate=rate)
    except Exception as exc:  # noqa: BLE001 - any failure to build the link skips the row, saying why
        return f"cannot build a shaped link here: {exc}"


def _row(report: Report, case: str, figures: dict[str, Figure], stats: dict[str, Any], target: float,
         note: str = "") -> None:
    r = ratio(figures["auto"], figures["none"])
    wire, raw = stats.get("compressed_bytes", 0), stats.get("uncompressed_bytes", 0)
    on = f"auto compressed {raw / 1e6:.0f} MB into {wire / 1e6:.0f} MB" if wire else "auto sent raw"
    report.add(Row("7 compression", case, {"auto samples/s": figures["auto"].text(),
                                           "none samples/s": figures["none"].text()},
                   ratio=r, target=f"auto / none ≥ {target}", met=r >= target,
                   note="; ".join(x for x in (on, note) if x), raw={k: v.values for k, v in figures.items()}))


def compression_scenario(report: Report, sizes: Any) -> None:
    length = max(4 * BATCH, sizes.seed_samples * 2)
    shape = list(sizes.seed_shape[:1]) + [128, 128] if len(sizes.seed_shape) == 3 else [13, 128, 128]
    args = {"length": length, "shape": shape}
    link = _shaped_link("1gbit")
    try:
        if isinstance(link, str):
            for case in ("1 Gbit/s link, compressible tiles", "1 Gbit/s link, incompressible bytes"):
                report.add(Row("7 compression", case, {}, note=f"skipped: {link}"))
        else:
            figures, stats = _auto_vs_none(link.addr_here, link.ns, "benchmarks.compression:Tiles", args,
                                           sizes.repeats)
            _row(report, "1 Gbit/s tbf-shaped veth link, compressible float32 tiles", figures, stats, 1.8)
            figures, stats = _auto_vs_none(link.addr_here, link.ns, "benchmarks.compression:Noise", args,
                                           sizes.repeats)
            _row(report, "1 Gbit/s tbf-shaped veth link, incompressible bytes", figures, stats, 0.95)
    finally:
        if not isinstance(link, str):
            link.close()
    figures, stats = _auto_vs_none("127.0.0.1", None, "benchmarks.compression:Tiles", args, sizes.repeats)
    _row(report, "tcp loopback, compressible float32 tiles", figures, stats, 0.95)
