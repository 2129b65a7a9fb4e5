"""Measurement plumbing: alternation, repeats, summaries, the results file and the Markdown table."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


def _commit() -> str:
    """The commit the benchmark runs on (with "+dirty" if the work tree differs), or "unknown"."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


@dataclass
class Figure:
    """Repeated measurements of one quantity (higher is better unless ``lower_is_better``)."""

    values: list[float] = field(default_factory=list)
    unit: str = ""
    lower_is_better: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def text(self, digits: int = 0) -> str:
        if not self.values:
            return "n/a"
        fmt = f"{{:.{digits}f}}"
        return f"{fmt.format(self.median)} ({fmt.format(min(self.values))}..{fmt.format(max(self.values))})"


def alternate(systems: dict[str, Callable[[], float]], repeats: int) -> dict[str, Figure]:
    """Run each system ``repeats`` times, alternating A B A B; each call returns one measurement."""
    figures = {name: Figure() for name in systems}
    for _ in range(repeats):
        for name, run in systems.items():
            figures[name].values.append(run())
    return figures


def ratio(a: Figure, b: Figure) -> float:
    return a.median / b.median if b.median else float("nan")


@dataclass
class Row:
    scenario: str
    case: str
    figures: dict[str, str]
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    raw: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Report:
    mode: str
    rows: list[Row] = field(default_factory=list)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))
    machine: dict[str, Any] = field(default_factory=lambda: {
        "cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
        "commit": _commit(), "load_average_at_start": os.getloadavg()})
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.scenario} | {row.case} | " + ", ".join(f"{k}: {v}" for k, v in row.figures.items())
              + (f" | ratio {row.ratio:.2f}" if row.ratio is not None else "") + (f" | {row.note}" if row.note else ""),
              flush=True)

    def save(self, folder: str) -> str:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{time.strftime('%Y-%m-%d')}{'' if self.mode == 'full' else '-' + self.mode}.json")
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)
        return path

    def markdown(self) -> str:
        lines = ["| scenario | case | figures: median (min..max) | Ferry / DataLoader | target | met |",
                 "|---|---|---|---|---|---|"]
        for r in self.rows:
            figs = "; ".join(f"{k} {v}" for k, v in r.figures.items())
            met = "" if r.met is None else ("yes" if r.met else "**no**")
            ratio_text = "" if r.ratio is None else f"{r.ratio:.2f}"
            lines.append(f"| {r.scenario} | {r.case} | {figs} | {ratio_text} | {r.target} | {met} |")
        return "\n".join(lines)
