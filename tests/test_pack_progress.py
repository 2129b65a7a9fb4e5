"""``ferry pack`` shows its progress (issue 18): a real dataset takes hours to pack. On a terminal one line is
redrawn in place, at most every REDRAW_S; otherwise (a log, a batch job) a line every STEP_PERCENT percent. Each
says the samples done, the write rate in MB/s and the time left."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from ferry.packing import REDRAW_S, PackProgress

from .helpers import REPO, producer_env

LINE = re.compile(r"^\s+(\d+)% (\d+)/(\d+) samples, [\d.]+ MB/s, (\d+:\d\d:\d\d|\?) left\s*$")


@pytest.mark.parametrize("fmt", ["tar", "packed"])
def test_off_a_terminal_a_line_every_few_percent(tmp_path, fmt):
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", fmt, "--dataset",
                          "tests.datasets:ClassSorted", "--dataset-arg", "length=400", "--shard-samples", "50",
                          str(tmp_path / "out")],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    progress = [LINE.match(line) for line in run.stdout.splitlines() if LINE.match(line)]
    assert "\r" not in run.stdout
    assert 15 <= len(progress) <= 21, run.stdout  # one per 5 %, none repeated
    percents = [int(m.group(1)) for m in progress]
    assert percents == sorted(percents) and len(set(percents)) == len(percents)
    assert progress[-1].group(2, 3) == ("400", "400")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_one_line_redrawn_with_rate_and_time_left():
    now = [100.0]
    stream = Terminal()
    progress = PackProgress(stream, clock=lambda: now[0])
    for done in range(1, 1001):
        now[0] += 0.0625  # 62.5 s in all, 16 samples a second (a step exact in binary)
        progress(done, 1000, done * 2_000_000)  # 2 MB a sample: 32 MB/s
    text = stream.getvalue()
    redraws = text.split("\r")[1:]
    assert 62.5 / REDRAW_S * 0.7 <= len(redraws) <= 62.5 / REDRAW_S + 1, len(redraws)
    assert text.endswith("\n") and text.count("\n") == 1
    for redraw in redraws:
        match = LINE.match(redraw)
        assert match and "32.0 MB/s" in redraw, redraw
        left = round(0.0625 * (1000 - int(match.group(2))), 6)
        assert match.group(4) == f"0:{int(left) // 60:02d}:{int(left) % 60:02d}", redraw
    assert " 100% 1000/1000 samples" in redraws[-1] and "0:00:00 left" in redraws[-1]
