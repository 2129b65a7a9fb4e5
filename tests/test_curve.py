"""CURVE: an authorized producer serves; an unauthorized one and a plaintext one get nothing through."""

import subprocess
import sys

import pytest

from ferry.common.errors import ConfigError
from ferry import RemoteLoader

from .helpers import REPO, LeakCheck, producer_env, wait_for


@pytest.fixture
def keys(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(tmp_path / "keys"), "--producer", "good"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "authorized producer keys" in out.stdout
    # a key pair that exists but is not authorized
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(tmp_path / "other"), "--producer", "evil"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0
    return tmp_path


def test_only_the_authorized_producer_gets_through(endpoint, spawn, keys, caplog):
    k = keys / "keys"
    args = {"length": 60, "delay": 0.01}
    evil = spawn(endpoint, "tests.datasets:PidDataset", args,
                 extra=["--curve-key", str(keys / "other" / "evil.key_secret"), "--curve-server-key", str(k / "server.key")])
    plain = spawn(endpoint, "tests.datasets:PidDataset", args)
    check = LeakCheck()
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30,
                      curve_secret_key=str(k / "server.key_secret"), curve_authorized_keys=str(k / "authorized")) as loader:
        # the unauthorized producer's handshake reaches the authenticator and is denied
        wait_for(lambda: any("DENIED" in r.getMessage() for r in caplog.records), 20, "a denied CURVE handshake")
        good = spawn(endpoint, "tests.datasets:PidDataset", args,
                     extra=["--curve-key", str(k / "good.key_secret"), "--curve-server-key", str(k / "server.key")])
        pids = {int(p[0]) for _, _, p in loader}
        stats = loader.stats()
    good_output = good.output()
    good.close()  # our own child, started after the snapshot
    check.assert_clean()  # the authenticator thread and its sockets are gone too
    assert pids == {good.pid}
    assert stats["producers_seen"] == 1 and stats["invalid_messages"] == 0
    assert "serving consumer" in good_output
    assert "serving consumer" not in evil.output() and "serving consumer" not in plain.output()


def test_curve_configuration_errors_are_clear(endpoint, keys):
    k = keys / "keys"
    with pytest.raises(ConfigError, match="does not exist"):
        RemoteLoader(endpoint=endpoint, batch_size=2, curve_secret_key=str(k / "nope"),
                     curve_authorized_keys=str(k / "authorized"))
    with pytest.raises(ConfigError, match="holds no secret key"):
        RemoteLoader(endpoint=endpoint, batch_size=2, curve_secret_key=str(k / "server.key"),
                     curve_authorized_keys=str(k / "authorized"))
    with pytest.raises(ConfigError, match="needs both"):
        RemoteLoader(endpoint=endpoint, batch_size=2, curve_secret_key=str(k / "server.key_secret"))
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset", "synthetic",
                          "--curve-key", str(k / "good.key")], capture_output=True, text=True, env=producer_env(),
                         cwd=REPO, timeout=60)
    assert out.returncode == 2 and "needs both" in out.stderr
