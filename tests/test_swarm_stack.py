"""deploy/swarm/stack.yaml: ``docker stack config -c`` accepts it (the docker CLI's own check of a stack file, no
daemon needed), and what it resolves to agrees with Ferry: every FERRY_* name is a real option with a value that
parses, the healthcheck is a real probe, the trainer's name resolves to every trainer task (dnsrr) on the port it
binds, and each CURVE key file a service names is a Docker secret it mounts, made by deploy/swarm/secrets.sh.
docker/swarm-e2e.sh deploys it for real (.ci/run).

Without the docker CLI or PyYAML these skip, saying why; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .deploy_names import check_producer_env, check_trainer_env
from .helpers import REPO
from .needs import cannot_run

STACK = os.path.join(REPO, "deploy", "swarm", "stack.yaml")


def stack_config(path: str) -> subprocess.CompletedProcess:
    if shutil.which("docker") is None:
        cannot_run("the docker CLI is not installed (apt-get install docker.io)")
    return subprocess.run(["docker", "stack", "config", "-c", path], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={k: v for k, v in os.environ.items() if not k.startswith("FERRY_")})


def resolved() -> dict:
    out = stack_config(STACK)
    assert out.returncode == 0, out.stderr
    try:
        import yaml
    except ImportError:
        cannot_run("PyYAML (the test extra) is not installed")
    return yaml.safe_load(out.stdout)


def test_docker_stack_config_accepts_the_stack_file_and_refuses_compose_yaml():
    stack = resolved()
    assert set(stack["services"]) == {"data", "trainer", "producer"}
    # why the stack file exists: the compose file's depends_on conditions are no stack's
    refused = stack_config(os.path.join(REPO, "compose.yaml"))
    assert refused.returncode != 0 and "depends_on" in refused.stderr, refused.stderr


def test_stack_services_use_real_options_a_real_probe_and_reach_every_trainer_task():
    services = resolved()["services"]
    trainer, producer = services["trainer"], services["producer"]
    check_trainer_env(trainer["environment"], "the stack's trainer")
    check_trainer_env(services["data"]["environment"], "the stack's data job")
    check_producer_env(producer["environment"], "the stack's producer")
    assert trainer["deploy"]["endpoint_mode"] == "dnsrr" and trainer["deploy"]["mode"] == "replicated-job"
    port = re.fullmatch(r"tcp://\*:(\d+)", trainer["environment"]["FERRY_ENDPOINT"]).group(1)
    assert producer["environment"]["FERRY_CONNECT"] == f"tcp://trainer:{port}"
    assert producer["healthcheck"]["test"] == ["CMD", "python3", "-m", "ferry.producer", "--probe", "ready"]
    assert producer["environment"]["FERRY_STATUS_FILE"]
    assert producer["deploy"]["replicas"] >= 1


def test_curve_keys_come_from_the_secrets_that_secrets_sh_makes():
    stack = resolved()
    with open(os.path.join(REPO, "deploy", "swarm", "secrets.sh")) as f:
        script = f.read()
    files = re.search(r"^FILES=\(([^)]*)\)", script, re.M).group(1).split()
    assert "name=ferry-$file" in script
    made = {f"ferry-{file}" for file in files}
    assert set(stack["secrets"]) == made and all(s["external"] for s in stack["secrets"].values())
    mounted = {}
    for name, service in stack["services"].items():
        targets = {f"/run/secrets/{s['target']}": s["source"] for s in service.get("secrets", [])}
        mounted[name] = set(targets.values())
        env = service["environment"]
        for variable in ("FERRY_CURVE_KEY", "FERRY_CURVE_SERVER_KEY", "FERRY_CURVE_SECRET_KEY"):
            if variable in env:
                assert env[variable] in targets, f"{name}: {variable}={env[variable]} is no mounted secret"
        if "FERRY_CURVE_AUTHORIZED_KEYS" in env:
            assert targets[env["FERRY_CURVE_AUTHORIZED_KEYS"] + "/producers.key"] == "ferry-producers.key"
    assert mounted["trainer"] == {"ferry-server.key_secret", "ferry-producers.key"}
    assert mounted["producer"] == {"ferry-producers.key_secret", "ferry-server.key"}  # never the trainer's secret
