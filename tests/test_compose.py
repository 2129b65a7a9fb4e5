"""compose.yaml: validated by docker-compose, and run for real as processes in network namespaces.

The second test reads compose.yaml and each Dockerfile's ENTRYPOINT, then runs every service's command
with its environment as a real process, each in its own network namespace named after the service (the
producers scaled to 3), with /etc/netns/<name>/hosts so that 'trainer' resolves. The shared volume is a
temporary folder. It checks that the scaled-out run completes with every batch; then the same running
producers serve a second trainer in the trainer's namespace (tests/compose_checker.py), which compares every
batch with torch's DataLoader over the dataset in the volume.

Where these cannot run (no root, no namespaces, no PyYAML, no docker-compose) they skip, saying why; under
``CI=true`` they fail instead.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest


from .helpers import REPO, producer_env
from .netns import cannot_run, make_network


def compose() -> dict:
    try:
        import yaml
    except ImportError:
        cannot_run("PyYAML (the test extra) is not installed")
    with open(os.path.join(REPO, "compose.yaml")) as f:
        return yaml.safe_load(f)


def entrypoint(dockerfile: str) -> list[str]:
    with open(os.path.join(REPO, dockerfile)) as f:
        for line in f:
            if line.startswith("ENTRYPOINT"):
                return json.loads(line[len("ENTRYPOINT"):])
    raise AssertionError(f"{dockerfile} has no ENTRYPOINT")


def test_compose_file_is_valid_for_docker_compose():
    if shutil.which("docker-compose") is None:
        cannot_run("docker-compose is not installed (.ci/run installs Debian's package)")
    out = subprocess.run(["docker-compose", "-f", "compose.yaml", "config", "-q"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # about 18 s; docker/e2e.sh runs compose.yaml for real too (.ci/run runs both)
def test_compose_services_run_as_namespaced_processes_and_train_on_every_batch(tmp_path):
    spec = compose()["services"]
    assert set(spec) == {"data", "trainer", "producer"}
    assert spec["producer"]["environment"]["FERRY_CONNECT"] == "tcp://trainer:5555"
    assert spec["producer"]["deploy"]["replicas"] == 2
    scale = 3
    hosts = ["data", "trainer"] + [f"producer-{i}" for i in range(1, scale + 1)]
    net = make_network(hosts)
    volume = str(tmp_path / "volume")
    os.makedirs(volume)
    overrides = {"FERRY_SAMPLES": "384", "FERRY_SIZE": "16", "FERRY_MIN_PRODUCERS": str(scale)}  # small tiles: the structure is what is tested

    def command(service: str) -> tuple[list[str], dict[str, str]]:
        s = spec[service]
        argv = entrypoint(s["build"]["dockerfile"]) + list(s.get("command", []))
        argv = [sys.executable if a in ("python", "python3") else a for a in argv]
        env = producer_env()
        for key, value in (s.get("environment") or {}).items():
            env[key] = str(value).replace("/data", volume)
        env.update(overrides)
        return argv, env

    procs = []
    try:
        argv, env = command("data")  # depends_on: service_completed_successfully
        done = subprocess.run(["ip", "netns", "exec", net.ns["data"], *argv], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        argv, env = command("trainer")
        trainer = subprocess.Popen(["ip", "netns", "exec", net.ns["trainer"], *argv], env=env, cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(trainer)
        for i in range(1, scale + 1):
            argv, env = command("producer")
            procs.append(subprocess.Popen(["ip", "netns", "exec", net.ns[f"producer-{i}"], *argv], env=env,
                                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        out, _ = trainer.communicate(timeout=180)
        assert trainer.returncode == 0, out
        match = re.search(r"epoch 0: (\d+) samples", out)
        assert match and int(match.group(1)) == 384, out
        done_line = re.search(r"done\. (\d+) batches from (\d+) producer", out)
        assert done_line and int(done_line.group(1)) == 12, out  # every batch: 384 / 32
        assert int(done_line.group(2)) == scale, f"the scaled-out producers did not all join: {out}"
        # the same producers move on to the next trainer on that endpoint, which checks every batch's contents
        argv, env = command("trainer")
        root = env["FERRY_DATA_DIR"]
        check = subprocess.run(["ip", "netns", "exec", net.ns["trainer"], sys.executable, "-m", "tests.compose_checker",
                                env["FERRY_ENDPOINT"], root, "32", str(scale)], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=180)
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"checked 12 batches from {scale} producers" in check.stdout, check.stdout + check.stderr
        for p in procs[1:]:  # docker compose down: SIGTERM, and each producer exits 0 after BYE
            p.terminate()
        assert [p.wait(20) for p in procs[1:]] == [0] * scale
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            if p.stdout:
                p.stdout.close()
        net.close()
