"""Several ranks: torchrun with 2 CPU ranks (gloo); one producer serves both through a port range."""

import json
import subprocess
import sys

from tests.datasets import PairDataset

from .helpers import REPO, free_port, producer_env, reference_batches


def test_two_ranks_get_disjoint_shards_that_cover_the_epoch(spawn, tmp_path):
    length = 50
    base = free_port()
    while True:  # two consecutive free ports
        if base + 1 < 65536:
            import socket

            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + 1))
                    break
                except OSError:
                    pass
        base = free_port()
    producer = spawn(f"tcp://127.0.0.1:{base}-{base + 1}", "tests.datasets:PairDataset", {"length": length})
    env = producer_env()
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), "tests/torchrun_worker.py", str(base), str(length),
                          str(tmp_path)], capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
    assert run.returncode == 0, run.stderr[-4000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text())["self"] for r in range(2)]
    assert [r["rank"] for r in records] == [0, 1] and all(r["world_size"] == 2 for r in records)
    assert records[0]["endpoints"] == [f"tcp://127.0.0.1:{base}"]
    assert records[1]["endpoints"] == [f"tcp://127.0.0.1:{base + 1}"]  # port + LOCAL_RANK
    for epoch in ("0", "1"):
        shards = [r["epochs"][epoch] for r in records]
        for rank, shard in enumerate(shards):
            expected = reference_batches(PairDataset(length), batch_size=4, drop_last=False, world_size=2, rank=rank,
                                         shuffle=True, seed=6, epoch=int(epoch))
            assert shard == [i for b in expected for i in b[1].tolist()]
        assert set(shards[0]) | set(shards[1]) == set(range(length))
        assert len(set(shards[0]) & set(shards[1])) == len(shards[0]) + len(shards[1]) - length  # only padding
    assert "serving consumer at tcp://127.0.0.1:%d" % base in producer.output()
    assert "serving consumer at tcp://127.0.0.1:%d" % (base + 1) in producer.output()
