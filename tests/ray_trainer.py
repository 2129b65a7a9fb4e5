"""The training script of tests/test_ray.py: a Ray driver on the head node of a cluster of network namespaces, with
a RemoteLoader whose producers are Ray actors (ferry.ray.RayProducers). Every batch is compared with torch's
DataLoader over the same dataset (tests.engine_datasets:SlowPairs).

    python -m tests.ray_trainer --address HEAD:PORT --bind ADDRESS --keys DIR --intruder-keys DIR --control DIR

1. *kill*: 2 producer actors (SPREAD: one per node), CURVE keys taken from the loader. An intruder actor, started by
   hand with a key pair the loader never authorized and a dataset of the same fingerprint but other values, tries
   to join for the whole phase. Mid-epoch, with tasks at the victim, one actor is ``ray.kill``ed for good, later
   another with a restart (``no_restart=False``); the time from each kill to its tasks' re-issue is measured
   (``stats()["reissued"]``), and the reasons the loader gives for the losses. Then one more actor, whose dataset
   fails to open the first time (exit status 4): Ray restarts it, and it serves.
2. *demand*: ``producers="auto"`` between 1 and 3, an epoch whose loop first takes a batch every ``--fast-step``
   seconds (it needs about 10 producers of 5 batches/s: more than it may have), then after ``--more-s`` seconds one
   batch every ``--slow-step`` seconds (it needs one) for ``--less-s`` seconds: every change of the actors' target,
   of the loader's live producers and of its demand gauge is recorded with its time. Then the samples lose their delay (DIR/fast) and the epoch ends.

Everything it saw goes to DIR/result.json (and DIR/status.json while it runs); an AssertionError (exit 1) names
the first batch that differs from DataLoader's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

import ray

from ferry import CurveOptions, ProducerExitError, RemoteLoader
from ferry.common.security import CurveClient
from ferry.producer import ProducerConfig
from ferry.ray import ProducerActor, RayProducers

from tests.engine_datasets import SlowPairs
from tests.helpers import assert_tree_equal, free_port, reference_batches

SPEC = "tests.engine_datasets:SlowPairs"
SEED = 11
POLL_S = 0.01


class Denials(logging.Handler):
    """Counts the loader's CURVE denials (logged by its authenticator)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "CURVE handshake DENIED" in record.getMessage():
            self.count += 1


class Control:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.result: dict = {}
        self.started = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def note(self, **fields) -> None:
        self.result.update(fields)
        self.dump("status.json", {"at": self.now(), **self.result})

    def dump(self, name: str, value: dict) -> None:
        path = os.path.join(self.folder, name)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f, indent=1, default=str)
        os.replace(path + ".tmp", path)


def check_epoch(loader: RemoteLoader, length: int, batch: int, epoch: int, each) -> int:
    expected = reference_batches(SlowPairs(length=length), batch_size=batch, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=SEED, epoch=epoch)
    count = 0
    loader.set_epoch(epoch)
    for seq, got in enumerate(loader):
        assert_tree_equal(got, expected[seq], f"epoch {epoch} batch {seq}")
        count += 1
        each(seq)
    assert count == len(expected), f"epoch {epoch}: {count} batches, DataLoader has {len(expected)}"
    return count


KILL_SAMPLES = 160


def kill_phase(args, loader: RemoteLoader, control: Control) -> None:
    length, batch = KILL_SAMPLES, 4
    with RayProducers(loader, producers=2, producer_options={"threads": 2, "slots": 2}) as producers:
        names = producers.wait_serving(timeout=120)
        nodes = sorted({a["node"] for a in producers.stats()["actors"]})
        control.note(kill_nodes=nodes, kill_names=names,
                     authorized_during=sorted(os.listdir(loader.curve.authorized_keys)))
        kills: dict = {}

        def kill_busiest(seq: int, no_restart: bool) -> None:
            stats = loader.stats()
            victim = max(stats["per_producer"], key=lambda n: stats["per_producer"][n]["in_flight"])
            held = stats["per_producer"][victim]["in_flight"]
            assert held >= 1, f"no task at any producer: {stats['per_producer']}"
            handle = producers.actors()[victim]
            before = stats["reissued"]
            killed = time.monotonic()
            ray.kill(handle, no_restart=no_restart)
            while loader.stats()["reissued"] == before:
                assert time.monotonic() - killed < 30, "the killed actor's tasks were never issued again"
                time.sleep(POLL_S)
            kills["dead" if no_restart else "restarted"] = {
                "seq": seq, "victim": victim, "held": held, "reissue_s": round(time.monotonic() - killed, 3)}
            control.note(kill=kills)

        def each(seq: int) -> None:
            if seq in (8, 24):
                kill_busiest(seq, no_restart=seq == 8)  # first for good (then replaced), then one Ray restarts
        count = check_epoch(loader, length, batch, 1, each)
        deadline = time.monotonic() + 60
        while loader.stats()["producers"] < 2:  # the replacement's and the restarted one's producers admitted
            assert time.monotonic() < deadline, f"only {loader.stats()['per_producer']} after the kills"
            time.sleep(0.05)
        control.note(kill_batches=count, kill=kills, kill_after=producers.wait_serving(timeout=60),
                     kill_stats=producers.stats())
        # an actor whose dataset fails to open the first time (exit status 4): Ray restarts it, and it serves
        once = os.path.join(args.control, "failed-once")
        with RayProducers(loader, producers=1, max_restarts=2,
                          producer_options={"threads": 1, "init": "tests.engine_datasets:fails_once"},
                          actor_options={"runtime_env": {"env_vars": {"TEST_FAILS_ONCE_FILE": once}}}) as restarted:
            names = restarted.wait_serving(timeout=120)
            deadline = time.monotonic() + 60
            while loader.stats()["producers"] < 3:
                assert time.monotonic() < deadline, f"the restarted actor never joined: {loader.stats()['per_producer']}"
                time.sleep(0.05)
            control.note(fails_once=names, failed_once=os.path.exists(once), fails_once_stats=restarted.stats())
        # a configuration error (a spec that does not resolve, exit status 2): ended for good, nothing restarted
        with RayProducers(loader, producers=2, dataset="tests.engine_datasets:NoSuchDataset") as broken:
            try:
                broken.wait_serving(timeout=90)
                outcome: dict = {"served": True}
            except ProducerExitError as exc:
                outcome = {"status": exc.status, "message": str(exc)}
            deadline = time.monotonic() + 60
            while broken.stats()["actors"]:  # both fail alike, and each is ended for good
                assert time.monotonic() < deadline, f"actors left after a configuration error: {broken.stats()}"
                time.sleep(0.05)
            control.note(config_error=outcome, config_error_stats=broken.stats())


def demand_phase(args, loader: RemoteLoader, control: Control) -> None:
    length, batch = args.demand_samples, 4
    changes: list = []
    live: list = []
    needed: list = []
    with RayProducers(loader, producers="auto", producers_min=1, producers_max=3,
                      producer_options={"threads": 1, "slots": 1, "ahead": 0}) as producers:
        producers.wait_serving(1, timeout=120)
        phase = {"more": control.now()}
        last = {"target": None, "live": None, "needed": None, "watched": 0.0}

        def watch() -> None:
            now = time.monotonic()
            if now - last["watched"] < 0.1:
                return
            last["watched"] = now
            target = producers.stats()["target"]
            stats = loader.stats()
            for key, value, into in (("target", target, changes), ("live", stats["producers"], live),
                                     ("needed", stats["producers_needed"], needed)):
                if value != last[key]:
                    last[key] = value
                    into.append([control.now(), value])

        def each(seq: int) -> None:
            watch()
            if "less" not in phase and control.now() - phase["more"] >= args.more_s:
                phase["less"] = control.now()
            if "done" not in phase:
                end = time.monotonic() + (args.slow_step if "less" in phase else args.fast_step)
                while time.monotonic() < end:  # the loop's step, the figures still watched
                    watch()
                    time.sleep(min(0.05, max(0.0, end - time.monotonic())))
            if "less" in phase and "done" not in phase:
                if control.now() - phase["less"] > args.less_s:  # measured: the rest of the epoch at full speed
                    phase["done"] = control.now()
                    open(args.fast_file, "w").close()
            control.note(demand_phase=phase, demand_target=changes, demand_live=live, demand_needed=needed)
        count = check_epoch(loader, length, batch, 2, each)
        control.note(demand_batches=count, demand_phase=phase, demand_target=changes, demand_live=live,
                     demand_needed=needed)


SEPARATE_SAMPLES = 600


def separate_phase(args, loader: RemoteLoader, control: Control) -> None:
    """Producers from another driver, which has no loader: started, scaled by the demand they hear, stopped."""
    stop, out = os.path.join(args.control, "separate-stop"), os.path.join(args.control, "separate.json")
    with open(os.path.join(args.control, "driver.out"), "wb") as log:
        driver = subprocess.Popen([sys.executable, "-m", "tests.ray_driver", "--address", args.address, "--endpoint",
                                   loader.endpoints[0], "--keys", args.keys, "--length", str(SEPARATE_SAMPLES),
                                   "--stop", stop, "--out", out], stdout=log, stderr=subprocess.STDOUT)
    live: list = []
    started = control.now()

    def each(seq: int) -> None:
        producers = loader.stats()["producers"]
        if not live or live[-1][1] != producers:
            live.append([round(control.now() - started, 3), producers])
        time.sleep(args.fast_step)  # a loop that needs more producers than the driver may start
    try:
        count = check_epoch(loader, SEPARATE_SAMPLES, 4, 3, each)
    finally:
        open(stop, "w").close()
        code = driver.wait(120)
    with open(out) as f:
        seen = json.load(f)
    control.note(separate_batches=count, separate_live=live, separate_driver=seen, separate_code=code,
                 separate_seen=loader.stats()["producers_seen"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--intruder-keys", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--demand-samples", type=int, default=8000)
    parser.add_argument("--more-s", type=float, default=62.0)
    parser.add_argument("--less-s", type=float, default=25.0)
    parser.add_argument("--fast-step", type=float, default=0.02)
    parser.add_argument("--slow-step", type=float, default=0.5)
    args = parser.parse_args()
    args.fast_file = os.path.join(args.control, "fast")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(name)s %(levelname)s %(message)s")
    denials = Denials()
    logging.getLogger("ferry.consumer").addHandler(denials)
    control = Control(args.control)
    ray.init(address=args.address, log_to_driver=True)
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2, f"{len(alive)} nodes alive"
    keys = CurveOptions(secret_key=os.path.join(args.keys, "server.key_secret"),
                        authorized_keys=os.path.join(args.keys, "authorized"))

    def loader_of(length: int, delay: float, **more) -> RemoteLoader:
        """A loader of its own per phase (its dataset's length is fixed by the first producer). Liveness 20 × 0.5 s:
        the heartbeat alone would take 10 s to give up on a killed producer."""
        return RemoteLoader(endpoint=f"tcp://{args.bind}:{free_port()}", dataset=SPEC,
                            dataset_args={"length": length, "delay": delay, **more}, batch_size=4, shuffle=True,
                            seed=SEED, heartbeat=0.5, liveness=20, no_producer_timeout=120, timeout=120, buffer_batches=8,
                            curve=keys, log_every=None)

    with loader_of(KILL_SAMPLES, 0.02) as loader:
        intruder = ray.remote(ProducerActor).options(num_cpus=1, max_restarts=0, max_concurrency=4).remote(
            ProducerConfig(endpoints=loader.endpoints, dataset=SPEC, dataset_args={"length": KILL_SAMPLES, "shift": 1},
                           threads=1, curve=CurveClient.load(os.path.join(args.intruder_keys, "intruder.key_secret"),
                                                             os.path.join(args.keys, "server.key"))))
        intruder_serve = intruder.serve.remote()
        intruder_where = ray.get(intruder.where.remote(), timeout=60)
        kill_phase(args, loader, control)
        intruder_figures = ray.get(intruder.figures.remote(), timeout=30)
        intruder.stop.remote()
        intruder_code = ray.get(intruder_serve, timeout=30)
        ray.kill(intruder)
        stats = loader.stats()
        control.note(intruder=intruder_where["name"], intruder_sent=(intruder_figures or {}).get("batches_sent"),
                     intruder_code=intruder_code, denials=denials.count, kill_producers_seen=stats["producers_seen"],
                     kill_per_producer=sorted(stats["per_producer"]))
    with loader_of(args.demand_samples, 0.05, until=args.fast_file) as loader:
        demand_phase(args, loader, control)
    with loader_of(SEPARATE_SAMPLES, 0.05) as loader:
        separate_phase(args, loader, control)
    control.note(authorized_after=sorted(os.listdir(keys.authorized_keys)))
    control.dump("result.json", control.result)
    ray.shutdown()
    print("trainer done", flush=True)


if __name__ == "__main__":
    main()
