"""deploy/kubernetes/: every manifest passes ``kubernetes-validate --strict`` offline (its bundled schemas, with any
network attempt sent to a closed port), the KEDA ScaledObject passes KEDA's own CRD schema (tests/keda/, vendored;
the validator knows no custom resources), and the files agree with each other and with Ferry: every FERRY_* name is
a real option with a value that parses, the probes are real probe kinds, each CURVE key file a container names is
mounted from a Secret that deploy/kubernetes/secrets.sh makes with that key, the headless Service selects the trainer
pods on the port they bind, and the ScaledObject scales the producer Deployment on a sum of an exported metric.

No cluster is needed. Where kubernetes-validate, PyYAML, jsonschema or kubectl is missing these skip, saying why;
under ``CI=true`` they fail instead (.ci/run installs them).
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
import stat
import subprocess
import sys

import pytest

from .deploy_names import PROBES, check_producer_env, check_trainer_env, exported_names, metrics_named
from .helpers import REPO
from .needs import cannot_run

KUBE = os.path.join(REPO, "deploy", "kubernetes")
MANIFESTS = ["configmap.yaml", "data.yaml", "trainer.yaml", "producer.yaml"]
CRD = os.path.join(REPO, "tests", "keda", "keda.sh_scaledobjects.yaml")
# kubernetes-validate reads its bundled schemas; a request anywhere would go to the discard port and fail
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}


def yaml_module():
    try:
        import yaml
    except ImportError:
        cannot_run("PyYAML (the test extra) is not installed")
    return yaml


def documents(name: str) -> list[dict]:
    with open(os.path.join(KUBE, name)) as f:
        return [d for d in yaml_module().safe_load_all(f) if d]


def resource(kind: str, name: str) -> dict:
    found = [d for f in MANIFESTS + ["scaledobject.yaml"] for d in documents(f)
             if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name} in deploy/kubernetes"
    return found[0]


def pod(kind: str, name: str) -> dict:
    return resource(kind, name)["spec"]["template"]


def env_of(container: dict) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        env.update(resource("ConfigMap", source["configMapRef"]["name"])["data"])
    return env


def kubernetes_validate(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("kubernetes-validate", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if tool is None:
        cannot_run("kubernetes-validate is not installed (pip install -e '.[test]')")
    return subprocess.run([tool, "--strict", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **OFFLINE})


def test_every_file_in_the_folder_is_checked_here():
    assert sorted(os.listdir(KUBE)) == sorted(MANIFESTS + ["scaledobject.yaml", "secrets.sh", "pool"])
    assert sorted(os.listdir(os.path.join(KUBE, "pool"))) == ["pool.yaml", "trial.yaml"]  # test_kubernetes_pool.py


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_passes_kubernetes_validate_strict_offline(name):
    out = kubernetes_validate(os.path.join(KUBE, name))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len(documents(name)), out.stdout


def test_kubernetes_validate_strict_refuses_a_field_that_does_not_exist(tmp_path):
    deployment = resource("Deployment", "ferry-producer")
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {"periodSeconds": 10}
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml_module().safe_dump(wrong))
    out = kubernetes_validate(str(path))
    assert out.returncode != 0 and "readinessProbes" in out.stdout + out.stderr, out.stdout + out.stderr


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused where Kubernetes would prune them: every object that lists its
    properties and neither allows others nor preserves unknown fields gets ``additionalProperties: false``."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [strict(s) for s in schema[key]]
    return schema


def keda_validator():
    try:
        import jsonschema
    except ImportError:
        cannot_run("jsonschema (which kubernetes-validate installs) is not installed")
    with open(CRD) as f:
        crd = yaml_module().safe_load(f)
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def test_scaled_object_passes_kedas_crd_schema():
    validator = keda_validator()
    scaled = resource("ScaledObject", "ferry-producer")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(scaled)]
    assert not errors, errors
    for path, value in ((("spec", "scaleTargetRefs"), {}), (("spec", "minReplicaCount"), "1"),
                        (("spec", "triggers"), [{"metadata": {}}])):
        wrong = copy.deepcopy(scaled)
        wrong[path[0]][path[1]] = value
        assert list(validator.iter_errors(wrong)), f"KEDA's schema took {path}={value!r}"


def test_scaled_object_scales_the_producer_deployment_on_the_jobs_summed_demand():
    scaled = resource("ScaledObject", "ferry-producer")["spec"]
    deployment = resource("Deployment", scaled["scaleTargetRef"]["name"])
    assert (scaled["scaleTargetRef"]["apiVersion"], scaled["scaleTargetRef"]["kind"]) == (
        deployment["apiVersion"], deployment["kind"])
    assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"  # replicas = producers needed
    query = trigger["metadata"]["query"]
    assert query.startswith("sum(ferry_producers_needed{"), query
    assert metrics_named(query) <= exported_names(), metrics_named(query) - exported_names()
    job = resource("Job", "ferry-trainer")
    assert f'job_name="{job["metadata"]["name"]}"' in query  # the label the Job controller gives its pods
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in trainer["ports"]}
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == ports["metrics"]


def test_producers_reach_every_trainer_pod_through_the_headless_service():
    service = resource("Service", "ferry-trainer")["spec"]
    job = pod("Job", "ferry-trainer")
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"].items() <= job["metadata"]["labels"].items()
    (trainer,) = job["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in trainer["ports"]}
    assert env_of(trainer)["FERRY_ENDPOINT"] == f"tcp://*:{ports['ferry']}"
    served = {p["targetPort"]: p["port"] for p in service["ports"]}
    assert served["ferry"] == ports["ferry"]
    (producer,) = pod("Deployment", "ferry-producer")["spec"]["containers"]
    assert env_of(producer)["FERRY_CONNECT"] == f"tcp://ferry-trainer:{ports['ferry']}"
    deployment = resource("Deployment", "ferry-producer")["spec"]
    assert deployment["selector"]["matchLabels"].items() <= deployment["template"]["metadata"]["labels"].items()


def test_every_ferry_variable_is_a_real_option_and_the_probes_are_real():
    (producer,) = pod("Deployment", "ferry-producer")["spec"]["containers"]
    env = env_of(producer)
    check_producer_env(env, "the producer Deployment")
    assert {"FERRY_CONNECT", "FERRY_DATASET", "FERRY_CURVE_KEY", "FERRY_CURVE_SERVER_KEY", "FERRY_STATUS_FILE"} <= set(env)
    for probe, kind in (("startupProbe", "ready"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
        command = producer[probe]["exec"]["command"]
        assert command == ["python3", "-m", "ferry.producer", "--probe", kind] and kind in PROBES, (probe, command)
    assert producer["resources"]["requests"] and producer["resources"]["limits"]
    job = pod("Job", "ferry-trainer")["spec"]
    for container in job["initContainers"] + job["containers"]:
        check_trainer_env(env_of(container), f"the trainer Job's {container['name']}")
    (trainer,) = job["containers"]
    assert trainer["resources"]["requests"]


def secret_files(pod_spec: dict, container: dict, made: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """Each file path a container sees from a Secret (``made``: each Secret's keys): (Secret name, key)."""
    volumes = {v["name"]: v["secret"] for v in pod_spec["volumes"] if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in volumes:
            source = volumes[mount["name"]]
            items = source.get("items") or [{"key": key, "path": key} for key in made[source["secretName"]]]
            for item in items:
                files[f"{mount['mountPath']}/{item['path']}"] = (source["secretName"], item["key"])
    return files


def test_secrets_sh_makes_the_secrets_and_keys_the_pods_mount_and_no_producer_gets_the_trainers_secret(tmp_path):
    if shutil.which("kubectl") is None:
        cannot_run("kubectl is not installed (apt-get install kubernetes-client)")
    keys = tmp_path / "keys"
    env = {**os.environ, "FERRY_KEYS_COMMAND": f"{sys.executable} -m ferry keys"}
    out = subprocess.run(["bash", os.path.join(KUBE, "secrets.sh"), "--print", str(keys)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    for secret_key in ("server.key_secret", "producers.key_secret"):
        assert stat.S_IMODE((keys / secret_key).stat().st_mode) == 0o600
    manifests = tmp_path / "secrets.yaml"
    manifests.write_text(out.stdout)
    checked = kubernetes_validate(str(manifests))
    assert checked.returncode == 0 and checked.stdout.count(" passed ") == 3, checked.stdout + checked.stderr
    made = {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
            for d in yaml_module().safe_load_all(out.stdout)}
    assert made["ferry-producer-curve"].keys() == {"producers.key_secret", "server.key"}
    assert made["ferry-trainer-curve"].keys() == {"server.key_secret"}
    assert made["ferry-authorized-keys"].keys() == {"producers.key"}  # what the trainer lets in: public keys only
    for data in made.values():
        for key, content in data.items():
            assert content == (keys / key).read_bytes(), key

    for kind, name in (("Job", "ferry-trainer"), ("Deployment", "ferry-producer")):
        spec = pod(kind, name)["spec"]
        for container in spec["containers"]:
            files = secret_files(spec, container, made)
            for secret, key in files.values():
                assert key in made.get(secret, {}), f"{kind} {name} mounts {secret}/{key}, which secrets.sh does not make"
            env = env_of(container)
            for variable in ("FERRY_CURVE_KEY", "FERRY_CURVE_SERVER_KEY", "FERRY_CURVE_SECRET_KEY"):
                if variable in env:
                    assert env[variable] in files, f"{kind} {name}: {variable}={env[variable]} is no mounted key"
            if "FERRY_CURVE_AUTHORIZED_KEYS" in env:
                folder = env["FERRY_CURVE_AUTHORIZED_KEYS"]
                assert files.get(f"{folder}/producers.key") == ("ferry-authorized-keys", "producers.key")
                assert all(key.endswith(".key") for path, (_, key) in files.items() if path.startswith(folder))
    (producer,) = pod("Deployment", "ferry-producer")["spec"]["containers"]
    seen = secret_files(pod("Deployment", "ferry-producer")["spec"], producer, made).values()
    assert all(key != "server.key_secret" for _, key in seen), seen
