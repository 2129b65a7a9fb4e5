"""Ferry installs under one name, ``ferry``: it never clashes with a user's own ``common``, ``consumer`` or
``producer`` package, and never imports a top-level module of those names itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

from .helpers import REPO

BARE_NAMES = ("common", "consumer", "producer")

# A training script, run from the user's project folder. Its dataset is defined in the script (forked local
# producers) or given as a built-in spec (producers started as `python -m ferry.producer`). Each sample says
# whether the producer that made it had a bare `common`/`consumer`/`producer` module loaded.
TRAIN = textwrap.dedent('''
    import sys

    import numpy as np
    import torch

    BARE = ("common", "consumer", "producer")
    USER_PACKAGES = {USER_PACKAGES}
    if USER_PACKAGES:
        import common, consumer, producer  # the user's own packages, imported before Ferry

    from ferry import RemoteLoader


    def foreign_modules():
        return [n for n in BARE if n in sys.modules and not USER_PACKAGES]


    class Squares:
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return np.full(3, i * i, dtype=np.int64), len(foreign_modules())


    def main():
        with RemoteLoader(dataset=Squares(), local_producers=2, batch_size=4, shuffle=False,
                          timeout=60) as loader:
            got = [(x.clone(), bad.clone()) for x, bad in loader]
        expected = [torch.tensor([[i * i] * 3 for i in range(b, b + 4)]) for b in range(0, 24, 4)]
        assert len(got) == 6, len(got)
        for (x, bad), want in zip(got, expected):
            assert torch.equal(x, want), (x, want)
            assert int(bad.sum()) == 0, "a producer imported a bare common/consumer/producer module"
        with RemoteLoader(dataset="synthetic", dataset_args={{"length": 16, "shape": [2, 3]}},
                          local_producers=2, batch_size=4, timeout=60) as loader:
            assert sum(1 for _ in loader) == 4
        if USER_PACKAGES:
            assert common.WHOSE == "user" and consumer.WHOSE == "user" and producer.WHOSE == "user"
            assert sys.modules["common"].__file__.startswith({FOLDER!r})
        else:
            assert not foreign_modules(), foreign_modules()
        print("OK")


    if __name__ == "__main__":
        main()
''')


def _run_training(folder: str, *, user_packages: bool, extra_path: str | None) -> subprocess.CompletedProcess:
    script = os.path.join(folder, "train.py")
    with open(script, "w") as f:
        f.write(TRAIN.format(USER_PACKAGES=user_packages, FOLDER=folder))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return subprocess.run([sys.executable, script], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=180)


def test_a_project_with_its_own_common_consumer_and_producer_packages(tmp_path):
    """The user's packages stay theirs, and local producers (forked and spawned by spec) still work."""
    for name in BARE_NAMES:
        os.makedirs(tmp_path / name)
        (tmp_path / name / "__init__.py").write_text('WHOSE = "user"\n')
    out = _run_training(str(tmp_path), user_packages=True, extra_path=None)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_no_bare_common_consumer_or_producer_module_is_imported(tmp_path):
    """With the repository's own folders importable as bare names, nothing of Ferry imports them: neither the
    trainer nor its local producers."""
    out = _run_training(str(tmp_path), user_packages=False, extra_path=REPO)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_import_ferry_does_not_import_torch_and_exports_the_errors():
    code = textwrap.dedent('''
        import sys
        import ferry
        assert "torch" not in sys.modules, "import ferry imported torch"
        for name in ("FerryError", "ConfigError", "NoProducersError", "RemoteSampleError",
                     "ProducerStartupError"):
            assert issubclass(getattr(ferry, name), ferry.FerryError) or name == "FerryError", name
        assert "torch" not in sys.modules
        from ferry import RemoteLoader
        assert RemoteLoader.__module__.startswith("ferry.consumer")
        print("OK")
    ''')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_python_m_ferry_producer_runs_from_anywhere():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--help"], cwd="/", env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--connect" in out.stdout, out.stdout + out.stderr


def test_the_wheel_holds_only_ferry(tmp_path):
    """Built from outside the checkout, the wheel's only top-level package is ``ferry/``."""
    # from a clean copy: a build/ folder left in the checkout would put stale modules into the wheel (and the
    # build would write one there)
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                                   ".mutation", "wheels"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "-w", str(tmp_path), "--no-deps",
                          "--no-build-isolation", "--quiet"], cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    wheels = [n for n in os.listdir(tmp_path) if n.endswith(".whl")]
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(tmp_path / wheels[0]) as wheel:
        names = wheel.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"ferry"}, top
    for package in ("common", "consumer", "producer"):
        assert f"ferry/{package}/__init__.py" in names, f"ferry/{package} is missing from the wheel"
    assert "ferry/consumer/loader.py" in names and "ferry/producer/__main__.py" in names
    # every module of the source folders, subpackages included (pyproject.toml lists packages one by one)
    sources = {f"ferry/{os.path.relpath(os.path.join(root, name), REPO)}"
               for top_folder in ("common", "consumer", "producer")
               for root, _, files in os.walk(os.path.join(REPO, top_folder)) if "__pycache__" not in root
               for name in files if name.endswith(".py")}
    assert sources - set(names) == set(), "modules missing from the wheel (a package not listed in pyproject.toml?)"
