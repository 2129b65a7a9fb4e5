"""deploy/kubernetes/pool/: one producer Deployment serving every trial of a sweep (issue 20). As the other manifests
(tests/test_kubernetes.py), checked offline: ``kubernetes-validate --strict``, KEDA's own schema for the pool's
ScaledObject, and agreement with Ferry and with each other: the pool's producers name no dataset of their own and
connect to the headless Service that selects every trial's pod on the port each trial binds; each FERRY_* name is a
real variable whose value parses; the ScaledObject scales the pool on the pool's demand (an exported metric), not
on one trial's; the keys the pods mount are the Secrets ../secrets.sh makes. No cluster is needed."""

from __future__ import annotations

import os

from ferry.producer.config import read_env

from .deploy_names import PROBES, check_producer_env, check_trainer_env, exported_names, metrics_named
from .test_kubernetes import KUBE, keda_validator, kubernetes_validate, yaml_module

POOL = os.path.join(KUBE, "pool")


def docs(name: str) -> list[dict]:
    with open(os.path.join(POOL, name)) as f:
        return [d for d in yaml_module().safe_load_all(f) if d]


def one(kind: str, name: str | None = None) -> dict:
    found = [d for f in ("pool.yaml", "trial.yaml") for d in docs(f)
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in deploy/kubernetes/pool"
    return found[0]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_pool_manifests_pass_kubernetes_validate_strict_offline():
    for name, resources in (("pool.yaml", 2), ("trial.yaml", 1)):  # the ScaledObject is KEDA's: checked below
        out = kubernetes_validate(os.path.join(POOL, name))
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count(" passed for resource ") == resources, (name, out.stdout + out.stderr)


def test_the_pools_scaled_object_passes_kedas_schema_and_scales_on_the_pools_demand():
    scaled = one("ScaledObject", "ferry-pool")
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in keda_validator().iter_errors(scaled)]
    assert not errors, errors
    spec = scaled["spec"]
    deployment = one("Deployment", spec["scaleTargetRef"]["name"])
    assert deployment["metadata"]["name"] == "ferry-pool"
    (trigger,) = spec["triggers"]
    query = trigger["metadata"]["query"]
    assert query.startswith("max(ferry_pool_demand{"), query  # every producer reports the same sum
    assert metrics_named(query) <= exported_names() | {"ferry_pool_demand"}
    from ferry.common.metrics import PRODUCER_FIGURES

    assert "ferry_pool_demand" in {f.also for f in PRODUCER_FIGURES}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert f'app_kubernetes_io_component="{labels["app.kubernetes.io/component"]}"' in query
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    (producer,) = deployment["spec"]["template"]["spec"]["containers"]
    assert annotations["prometheus.io/port"] == env_of(producer)["FERRY_METRICS_PORT"]


def test_pool_producers_name_no_dataset_and_reach_every_trial_through_the_headless_service():
    service = one("Service", "sweep-trainers")["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    trial = one("Job")["spec"]["template"]
    assert service["selector"].items() <= trial["metadata"]["labels"].items()
    (trainer,) = trial["spec"]["containers"]
    port = {p["name"]: p["containerPort"] for p in trainer["ports"]}["ferry"]
    assert "tcp://*:%d" % port in trainer["command"]
    assert {p["targetPort"]: p["port"] for p in service["ports"]}["ferry"] == port
    check_trainer_env(env_of(trainer), "the trial Job")

    deployment = one("Deployment", "ferry-pool")["spec"]
    assert deployment["selector"]["matchLabels"].items() <= deployment["template"]["metadata"]["labels"].items()
    (producer,) = deployment["template"]["spec"]["containers"]
    env = env_of(producer)
    check_producer_env(env, "the pool Deployment")
    assert "FERRY_DATASET" not in env  # the trials name theirs
    assert env["FERRY_CONNECT"] == f"tcp://sweep-trainers:{port}"
    assert read_env({"FERRY_ALLOW_DATASET": env["FERRY_ALLOW_DATASET"]})
    for probe, kind in (("startupProbe", "ready"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
        assert producer[probe]["exec"]["command"] == ["python3", "-m", "ferry.producer", "--probe", kind]
        assert kind in PROBES


def test_pool_and_trials_mount_the_keys_that_secrets_sh_makes():
    """The same Secrets as the single-job files: producers get their key pair and the trainer's public key, a
    trial the trainer's key pair and the authorized keys; no producer sees the trainer's secret key."""
    (producer,) = one("Deployment", "ferry-pool")["spec"]["template"]["spec"]["containers"]
    pool_volumes = {v["name"]: v["secret"] for v in one("Deployment", "ferry-pool")["spec"]["template"]["spec"]["volumes"]
                    if "secret" in v}
    assert {s["secretName"] for s in pool_volumes.values()} == {"ferry-producer-curve"}
    assert {i["key"] for s in pool_volumes.values() for i in s["items"]} == {"producers.key_secret", "server.key"}
    mounts = {m["name"]: m["mountPath"] for m in producer["volumeMounts"]}
    env = env_of(producer)
    for variable, key in (("FERRY_CURVE_KEY", "producers.key_secret"), ("FERRY_CURVE_SERVER_KEY", "server.key")):
        assert env[variable] == f"{mounts['curve']}/{key}"
    trial = one("Job")["spec"]["template"]["spec"]
    (trainer,) = trial["containers"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in trial["volumes"]}
    mounts = {m["mountPath"]: secrets[m["name"]] for m in trainer["volumeMounts"]}
    env = env_of(trainer)
    assert mounts[os.path.dirname(env["FERRY_CURVE_SECRET_KEY"])] == "ferry-trainer-curve"
    assert mounts[env["FERRY_CURVE_AUTHORIZED_KEYS"]] == "ferry-authorized-keys"
