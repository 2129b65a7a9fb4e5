"""common/heap.py: a process keeps freed blocks for reuse (so a batch-sized buffer freed every batch is not
faulted in again), unless FERRY_KEEP_FREED_MEMORY=0 says to keep glibc's defaults. A trainer does only when
its script calls ``ferry.keep_freed_memory()``: building, using and closing a loader leaves glibc's settings
as they were. Each case runs in a fresh interpreter: the settings are process-wide and applied once."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

PROGRAM = r"""
import json, resource, sys
import numpy as np
from ferry.common.heap import keep_freed_memory
applied = keep_freed_memory()
faults = []
for _ in range(12):  # three 16 MiB blocks allocated, written and freed: a consumer holding received frames
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [np.empty(16 << 20, np.uint8) for _ in range(3)]
    for block in blocks:
        block.fill(1)
    del blocks, block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults[2:]}))
"""


# The observable: 128 MiB in 16 MiB blocks taken with malloc, written, freed, six rounds (the last four
# counted). With glibc's defaults (even after its mmap threshold adapted, at most 32 MiB, trim 64 MiB) the
# freed 128 MiB go back to the kernel every round and are faulted in again: a fault per 4 KiB, 32k a round
# (malloc'd directly, so numpy's huge-page advice does not blur the count). Kept, they are reused: none.
LOADER_PROGRAM = r"""
import ctypes, json, resource
import numpy as np
import ferry
from ferry import RemoteLoader

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

def faults_per_round(size=16 << 20, blocks=8):
    faults = []
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        taken = [libc.malloc(size) for _ in range(blocks)]
        for block in taken:
            ctypes.memset(block, 1, size)
        for block in taken:
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults[2:]

class Megabytes:  # 1 MiB samples over the socket (no shared memory): libzmq mallocs every received frame
    def __len__(self): return 64
    def __getitem__(self, i): return np.full(1 << 18, i, np.float32), i

before = faults_per_round()
with RemoteLoader(dataset=Megabytes(), local_producers=2, batch_size=4, shared_memory=False, timeout=60) as loader:
    during = faults_per_round()
    batches = sum(1 for _ in loader)
after = faults_per_round()
applied = ferry.keep_freed_memory()
print(json.dumps({"batches": batches, "before": before, "during": during, "after": after, "applied": applied,
                  "called": faults_per_round()}))
"""


def run(env_value: str | None, program: str = PROGRAM) -> dict:
    env = dict(os.environ)
    env.pop("FERRY_KEEP_FREED_MEMORY", None)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if env_value is not None:
        env["FERRY_KEEP_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_loader_leaves_the_trainers_heap_settings_and_the_explicit_call_changes_them():
    got = run(None, LOADER_PROGRAM)
    assert got["batches"] == 16, got
    # measured 32,736 faults every round before, during and after the loader (glibc's defaults): 128 MiB / 4 KiB
    for when in ("before", "during", "after"):
        assert min(got[when]) > 16_000, (when, got)
    assert got["applied"] is True
    assert max(got["called"]) < 200, got  # measured 0: the call, and only the call, keeps freed memory


def test_the_environment_turns_the_explicit_call_off_in_a_trainer():
    got = run("0", LOADER_PROGRAM)
    assert got["applied"] is False
    assert min(got["called"]) > 16_000, got


def test_freed_blocks_are_reused_not_faulted_in_again():
    kept = run(None)
    assert kept["applied"] is True
    # 48 MiB: reused memory takes (almost) no fault again (measured 0 a round)
    assert max(kept["faults"]) < 200, kept


def test_the_environment_keeps_glibc_defaults():
    default = run("0")
    assert default["applied"] is False
    # glibc's default trim threshold (twice its adapted mmap threshold) gives the freed 48 MiB back to the
    # kernel every round, which faults it in again (measured about 1.5k a round, with huge pages)
    assert min(default["faults"]) > 400, default


@pytest.mark.parametrize("value", ["no", "O", "2", "off"])
def test_a_value_other_than_0_or_1_is_an_error_naming_the_variable(value):
    env = {**os.environ, "FERRY_KEEP_FREED_MEMORY": value}
    out = subprocess.run([sys.executable, "-c", "from ferry.common.heap import keep_freed_memory; keep_freed_memory()"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "ConfigError: FERRY_KEEP_FREED_MEMORY must be 0" in out.stderr and repr(value) in out.stderr, out.stderr


def test_a_producer_started_with_a_bad_value_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "FERRY_KEEP_FREED_MEMORY": "off"}
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", f"ipc://{tmp_path}/none.sock",
                          "--dataset", "synthetic"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "FERRY_KEEP_FREED_MEMORY must be 0" in out.stderr and "'off'" in out.stderr


def test_a_loader_with_local_producers_refuses_a_bad_value_before_forking_any():
    code = ("import numpy as np\n"
            "from ferry import RemoteLoader, ConfigError\n"
            "class D:\n"
            "    def __len__(self): return 4\n"
            "    def __getitem__(self, i): return np.zeros(2), i\n"
            "try:\n"
            "    RemoteLoader(dataset=D(), local_producers=2, batch_size=2, timeout=30)\n"
            "except ConfigError as exc:\n"
            "    print('refused:', exc)\n")
    env = {**os.environ, "FERRY_KEEP_FREED_MEMORY": "yes"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: FERRY_KEEP_FREED_MEMORY must be 0" in out.stdout
    assert "Traceback" not in out.stderr, out.stderr  # no producer was started to fail on it
