"""The consumer core holds logic only: none of its modules imports zmq, threading, socket or time.

Time comes in as a value on each event, sockets stay in the io thread (ferry.consumer.io), and the core's
tests (tests/test_core.py) run without either.
"""

import ast
import pathlib

import ferry.consumer.core

FORBIDDEN = {"zmq", "threading", "socket", "time"}


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_core_module_imports_io_threads_or_the_clock():
    folder = pathlib.Path(ferry.consumer.core.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert len(modules) >= 8, modules  # the core's rooms are all here
    offenders = {p.name: sorted(imported_modules(p) & FORBIDDEN) for p in modules if imported_modules(p) & FORBIDDEN}
    assert offenders == {}


def test_the_check_sees_an_import_when_there_is_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom time import monotonic\nimport zmq.asyncio\n")
    assert imported_modules(module) & FORBIDDEN == {"time", "zmq"}
