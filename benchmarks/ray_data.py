"""Scenario 8: Ray Data as a peer on the seed workload (issue 32). ``python -m benchmarks --only 8`` (needs
``ferry[ray]``).

The seed workload as scenario 1 defines it, through a transform written in torch (:class:`~benchmarks.datasets.
SeedTiles`: ``np.load`` of a float32 tile, normalized and flipped with torch), batch 32, 2 CPUs: DataLoader with 2
workers, Ferry with 2 local producers, Ray Data on a local Ray cluster of 2 CPUs (``ray.init(num_cpus=2)``, items
``map``ped per row, ``iter_torch_batches``). Each run is one system in a fresh process of its own
(benchmarks/ray_peers.py: two epochs from construction), the systems alternating, ``Sizes.repeats`` rounds. For
each run:

* time to the first batch and epoch 0, from construction (for Ray Data that includes ``ray.init``, shown apart);
* the warm epoch (the next one, from ``iter()``);
* peak memory (the sum of PSS) and CPU seconds of the run's whole process tree (benchmarks/proctree.py: its
  workers, producers, and Ray's daemons and workers);
* whether the order it yielded was the planned one, epoch by epoch.

Rows give each figure's median (min..max) per system, with Ferry's and Ray Data's ratios to DataLoader's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from .harness import Figure, Report, Row, ratio
from .proctree import TreeSampler

SYSTEMS = ("dataloader", "ferry", "raydata")
NAMES = {"dataloader": "DataLoader", "ferry": "Ferry", "raydata": "Ray Data"}
#: a run's longest wall time (Ray Data's epoch 0 took 10-30 s here at 384 tiles) [Unit: second]
RUN_TIMEOUT_S = 900


def run_one(system: str, root: str, cpus: int = 2) -> dict:
    """One run of ``system`` in its own process tree; its JSON line plus ``pss_mb``, ``cpu_s``, ``processes``."""
    from .scenarios import REPO, env

    sampler = TreeSampler()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.ray_peers", system, root, "--cpus", str(cpus)],
                            env=sampler.environ(env()), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    sampler.start(proc.pid)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise RuntimeError(f"{system} did not finish within {RUN_TIMEOUT_S} s") from None
    finally:
        tree = sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{system} exited {proc.returncode}: {err.decode(errors='replace')[-3000:]}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    result.update(pss_mb=tree.peak_pss_mb, cpu_s=tree.cpu_s, processes=tree.processes)
    return result


def ray_data_scenario(report: Report, sizes) -> None:
    if importlib.util.find_spec("ray") is None:  # the runs import it in their own processes
        print("  (scenario 8 skipped: Ray is not installed: pip install 'ferry[ray]')", flush=True)
        report.notes.append("scenario 8 skipped: Ray is not installed")
        return
    from .scenarios import make_npy

    root = tempfile.mkdtemp(prefix="ferry-bench-ray-")
    load_before = os.getloadavg()
    try:
        make_npy(root, sizes.ray_samples, sizes.seed_shape, "float32")
        os.sync()
        runs: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
        for _ in range(sizes.repeats):
            for system in SYSTEMS:
                runs[system].append(run_one(system, root))
                print(f"    {system}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in runs[system][-1].items()), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    shape = "x".join(map(str, sizes.seed_shape))
    case = f"{sizes.ray_samples} float32 tiles {shape}, torch transform, batch 32, 2 CPUs"
    rows = (("epoch 0 from construction", "epoch0_sps", "samples/s", 1.0, False),
            ("warm epoch", "warm_sps", "samples/s", 1.0, False),
            ("time to first batch", "first_s", "ms", 1e3, True),
            ("peak PSS of the process tree", "pss_mb", "MB", 1.0, True),
            ("CPU seconds of the process tree", "cpu_s", "s", 1.0, True))
    for what, key, unit, scale, lower in rows:
        figs = {s: Figure([r[key] * scale for r in runs[s]], unit, lower) for s in SYSTEMS}
        shown = {f"{NAMES[s]} {unit}": figs[s].text(0 if figs[s].median >= 10 else 2) for s in SYSTEMS}
        note = f"Ray Data / DataLoader = {ratio(figs['raydata'], figs['dataloader']):.2f}; {load}"
        if key == "first_s":
            note += f"; Ray Data's ray.init alone {Figure([r['init_s'] for r in runs['raydata']]).text(1)} s"
        report.add(Row("8 Ray Data", f"{what}: {case}", shown, ratio=ratio(figs["ferry"], figs["dataloader"]),
                       note=note, raw={s: figs[s].values for s in SYSTEMS}))
    kept = {s: f"{sum(sum(r['order_ok']) for r in runs[s])}/{sum(len(r['order_ok']) for r in runs[s])}"
            for s in SYSTEMS}
    report.add(Row("8 Ray Data", f"planned order kept, epochs: {case}", {f"{NAMES[s]}": kept[s] for s in SYSTEMS},
                   note="the same plan for all (each epoch's randperm): a sampler for DataLoader and Ferry, the items' "
                        "order for Ray Data (its defaults: preserve_order off)",
                   raw={s: [float(ok) for r in runs[s] for ok in r["order_ok"]] for s in SYSTEMS}))
