"""Ferry on Ray, for real (issue 32): a Ray cluster of two nodes, each a network namespace (tests/ray_cluster.py), and a
training script on the head node (tests/ray_trainer.py) whose producers are Ray actors started by
``ferry.ray.RayProducers``, every batch compared with torch's DataLoader.

* an epoch exact with a busy producer actor ``ray.kill``ed: its tasks issued again within 1 s, the loader told by
  the manager (its log names the actor's death), not by the heartbeat (10 s here); the actor replaced; another one
  killed with a restart: told too, and serving again; one whose dataset fails to open at first (exit status 4):
  restarted by Ray, it serves; actors whose spec does not resolve (exit status 2): ended for good, never restarted,
  the manager raising ProducerExitError;
* an intruder actor with a key pair the loader never authorized and a dataset of the same fingerprint but other
  values: denied at the CURVE handshake, it delivers nothing;
* ``producers="auto"``: a loop that needs more producers than it has, then one: the actors follow the loader's
  demand gauge up and down mid-epoch, each within 15 s of the loop's change, with at most one change of
  direction a minute;
* from a separate driver (another process, no loader): producer actors from the loader's endpoint and key files,
  their count following the demand they hear in their consumer's PINGs;
* nothing left: no producer actor once the manager closed, the key it authorized removed, and after the cluster's
  teardown no process in its namespaces, no namespace, no folder.

Opt-in (marker ``engine``: ``pytest -m engine tests/test_ray.py``; .ci/run runs it after the suite, about 3
minutes). Without root, network namespaces or Ray (``pip install 'ferry[ray]'``) it skips; under ``CI=true`` it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, producer_env, wait_for
from .ray_cluster import HEAD, WORKER, RayCluster

pytestmark = [pytest.mark.engine, pytest.mark.netns, pytest.mark.timeout(480)]

#: the bounds and the checks of the demand phase
MOST, FOLLOW_S, REVERSAL_S = 3, 15.0, 60.0


def ferry_keys(folder: Path, producer: str) -> None:
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(folder), "--producer", producer],
                         capture_output=True, text=True, cwd=REPO, env=producer_env(), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def actor_processes(cluster: RayCluster) -> list[str]:
    """The producer actors' processes on the cluster's nodes (Ray names them ``ray::ProducerActor...``)."""
    found = []
    for node in (HEAD, WORKER):
        for pid in cluster.pids(node):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if title.startswith("ray::ProducerActor"):
                found.append(f"{node}:{pid}:{title}")
    return found


def first_at(series: list, predicate) -> float | None:
    return next((at for at, value in series if value is not None and predicate(value)), None)


def test_ray_actors_serve_an_exact_epoch_through_a_kill_follow_demand_and_keep_an_intruder_out(tmp_path):
    keys, intruder_keys, control = tmp_path / "keys", tmp_path / "intruder", tmp_path / "control"
    control.mkdir()
    ferry_keys(keys, "good")
    ferry_keys(intruder_keys, "intruder")
    authorized = sorted(os.listdir(keys / "authorized"))
    cluster = RayCluster()
    namespaces, folder = None, cluster.folder
    left: dict = {}
    try:
        cluster.start()
        namespaces = dict(cluster.net.ns)
        log = cluster.folder / "trainer.out"
        trainer = cluster.popen(HEAD, [sys.executable, "-m", "tests.ray_trainer", "--address", cluster.address,
                                       "--bind", cluster.net.addr[HEAD], "--keys", str(keys),
                                       "--intruder-keys", str(intruder_keys), "--control", str(control)], log=log)
        try:
            code = trainer.wait(420)
        except subprocess.TimeoutExpired:
            trainer.kill()
            code = trainer.wait(10)
        output = log.read_text(errors="replace")
        (tmp_path / "trainer.out").write_text(output)
        report = f"trainer exited {code}\n{output[-6000:]}\n{cluster.logs()}"
        assert code == 0, report
        result = json.loads((control / "result.json").read_text())

        # the kills: two actors, one per node; a victim's tasks issued again within 1 s, told by the manager
        assert result["kill_nodes"] == sorted(cluster.net.addr[n] for n in (HEAD, WORKER)), result["kill_nodes"]
        dead, restarted = result["kill"]["dead"], result["kill"]["restarted"]
        assert dead["held"] >= 1 and dead["reissue_s"] < 1.0, dead
        assert f"producer {dead['victim']} lost (its Ray actor died: ActorDiedError" in output, report
        assert "is dead for good (ActorDiedError" in output and "a new one starts in 1 s" in output, report
        # killed with a restart: the loader told too (well before its 10 s heartbeat window), the actor served again
        assert restarted["held"] >= 1 and restarted["reissue_s"] < 5.0, restarted
        assert f"producer {restarted['victim']} lost (its Ray actor died" in output, report
        assert "Ray restarts it" in output, report
        after = result["kill_after"]
        assert len(after) == 2 and not {dead["victim"], restarted["victim"]} & set(after), after
        assert result["kill_batches"] == 40
        # exit status 2 (a spec that does not resolve): ProducerExitError from wait_serving, the actors ended for good
        broken = result["config_error"]
        assert broken.get("status") == 2 and "NoSuchDataset" in broken["message"], broken
        assert result["config_error_stats"]["actors"] == [] and result["config_error_stats"]["failure"], result
        # exit status 4 (its dataset did not open): the process ended, Ray restarted the actor, and it serves
        assert result["failed_once"] and len(result["fails_once"]) == 1, result
        assert "DatasetOpenError" in output and "(exit status 4)" in output, report

        # the intruder: denied at the handshake, never admitted, nothing delivered; its own actor stopped with 0
        assert result["denials"] >= 1 and result["intruder_sent"] == 0 and result["intruder_code"] == 0, result
        # the two actors, the dead one's replacement, the restarted one's new process, the one that failed once
        assert result["kill_producers_seen"] == 5, result
        assert result["intruder"] not in result["kill_per_producer"]

        # demand: up to the most while the loop needs more, down to one when it needs one; no flapping
        phase, target, live = result["demand_phase"], result["demand_target"], result["demand_live"]
        assert result["demand_batches"] == 2000 and "done" in phase, phase
        up = first_at(live, lambda n: n >= MOST)
        assert up is not None and up - phase["more"] <= FOLLOW_S, (phase, live, result["demand_needed"])
        down = first_at([x for x in live if x[0] >= phase["less"]], lambda n: n == 1)
        assert down is not None and down - phase["less"] <= FOLLOW_S, (phase, live, result["demand_needed"])
        directions = [(at, 1 if value > before else -1)
                      for (_, before), (at, value) in zip(target, target[1:]) if value != before]
        turns = [at for (_, a), (at, b) in zip(directions, directions[1:]) if a != b]
        assert len(turns) == 1 and all(b - a >= REVERSAL_S for a, b in zip(turns, turns[1:])), target
        assert [value for _, value in target][0] == 1 and max(v for _, v in target) == MOST, target

        # a separate driver, with no loader: the actors it starts serve an exact epoch, and follow the demand their
        # producers hear (1 -> 2), then stop when it closes
        driver = result["separate_driver"]
        assert result["separate_code"] == 0 and driver["stopped"] and result["separate_batches"] == 150, result
        assert [t for _, t in driver["targets"]] == [1, 2], driver
        assert max(n for _, n in result["separate_live"]) == 2, result["separate_live"]

        # the manager's key was authorized while its actors ran, and removed with them
        assert len(result["authorized_during"]) == len(authorized) + 1, result["authorized_during"]
        assert result["authorized_after"] == authorized
        assert sorted(os.listdir(keys / "authorized")) == authorized
        wait_for(lambda: not actor_processes(cluster), 15, "the producer actors' processes to end", interval=0.2)
    finally:
        left = cluster.close()
    assert not left, f"processes still running in the cluster's namespaces after its nodes stopped: {left}"
    if namespaces is not None:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        assert not [ns for ns in namespaces.values() if ns in listed], listed
    assert not folder.exists()
