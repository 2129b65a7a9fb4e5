"""Each option is declared once (issue 17): its type, default, bounds and doc drive the checks on both sides,
the producer's flags and FERRY_* variables, and what a loader's local mode passes to the producers it starts."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import pytest

from ferry import ConfigError, CurveOptions, LocalOptions, RemoteLoader, TransportOptions
from ferry.common.settings import setting_of, shared_values
from ferry.consumer.options import KEYWORDS
from ferry.producer import PRODUCER_ENV, ProducerConfig, command_line
from ferry.producer.cli import build_parser, command_line_values, config_from_command_line
from ferry.producer.config import COMMAND_LINE, read_env

GROUPS = (LocalOptions, TransportOptions, CurveOptions)


def declarations(cls: type) -> dict:
    return {f.name: setting_of(f) for f in dataclasses.fields(cls)}


# --- one declaration per option --------------------------------------------------------------------------
def test_every_loader_keyword_is_declared_once_and_documented():
    keywords = set(inspect.signature(RemoteLoader.__init__).parameters) - {"self", "dataloader_options"}
    flat = [name for group in GROUPS for name in group.flat_keywords()]
    assert len(flat) == len(set(flat)) and not set(flat) & set(KEYWORDS)
    assert set(KEYWORDS) | set(flat) == keywords
    doc = RemoteLoader.__doc__
    assert all(f"\n    {name}: " in doc for name in KEYWORDS), doc
    assert all(f"``{name}``" in doc for name in flat), doc
    for group in GROUPS:  # each group's docstring says every field, from its declaration
        assert all(f"        {f.name}: {setting_of(f).doc[:20]}" in group.__doc__ for f in dataclasses.fields(group))


def test_the_options_both_sides_take_are_one_declaration():
    producer, local, transport = declarations(ProducerConfig), declarations(LocalOptions), declarations(TransportOptions)
    for name in ("threads", "slots", "ahead", "transform", "collate", "init", "collate_args", "transform_args",
                 "seed_per_sample"):
        assert local[name] is producer[name], name
    for name in ("heartbeat", "liveness"):
        assert transport[name] is producer[name], name
    assert KEYWORDS["metrics_port"] is producer["metrics_port"]
    # so a producer that local mode configures gets exactly those, from the loader's groups
    values = shared_values(ProducerConfig, LocalOptions(count=2, threads=3, transform="m:f", ahead=1),
                           TransportOptions(heartbeat=0.5))
    assert values == {"threads": 3, "slots": 2, "heartbeat": 0.5, "liveness": 5, "transform": "m:f", "init": None,
                      "collate": None, "collate_args": {}, "transform_args": {}, "ahead": 1, "seed_per_sample": None}


@pytest.mark.parametrize("name, value, group", [
    ("threads", 0, LocalOptions), ("threads", 2.0, LocalOptions), ("slots", 65, LocalOptions),
    ("ahead", -1, LocalOptions), ("ahead", 65, LocalOptions),
    ("heartbeat", 0, TransportOptions), ("heartbeat", "1", TransportOptions), ("liveness", 1, TransportOptions),
    ("transform", "no_colon", LocalOptions), ("init", 3, LocalOptions), ("compression", "gzip", TransportOptions),
])
def test_a_rule_is_written_once_so_both_sides_say_the_same(name, value, group):
    with pytest.raises(ConfigError) as on_producer:
        ProducerConfig(endpoints=("tcp://127.0.0.1:1",), dataset="synthetic", **{name: value})
    with pytest.raises(ConfigError) as in_group:
        group(**({"count": 1} if group is LocalOptions else {}), **{name: value})
    assert type(on_producer.value) is type(in_group.value)
    assert str(on_producer.value) == str(in_group.value).replace(f"{group.__name__}.", "")


# --- the producer's command line and variables ----------------------------------------------------------
def test_every_flag_and_variable_is_in_the_help_with_its_default():
    text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    for setting in COMMAND_LINE.values():
        assert setting.variable in text, setting.variable
        if setting.flag:
            assert f"{setting.flag} " in text and f"[env {setting.variable}]" in text, setting.flag
    assert "--threads THREADS loading threads in each producer" in text and "By default 4 for a built-in dataset" in text
    assert "a dataset class of your own is called one sample at a time" in text
    assert "FERRY_UNREACHABLE_WARNING_S: first warn" in text


#: Every variable: a text that parses, its value, and (where the kind refuses some text) one that does not.
VARIABLES = {
    "FERRY_CONNECT": (" tcp://a:1, ipc:///x ", ["tcp://a:1", "ipc:///x"], None),
    "FERRY_DATASET": ("synthetic", "synthetic", None),
    "FERRY_ALLOW_DATASET": (" a.b:c, d:e ", ["a.b:c", "d:e"], None),
    "FERRY_DATASET_ARGS": ('{"length": 4}', {"length": 4}, "[1, 2]"),
    "FERRY_THREADS": ("8", 8, "eight"),
    "FERRY_SLOTS": ("3", 3, "2.5"),
    "FERRY_AHEAD": ("0", 0, "1.5"),
    "FERRY_HEARTBEAT": ("0.25", 0.25, "fast"),
    "FERRY_LIVENESS": ("7", 7, "7.5"),
    "FERRY_UNREACHABLE_WARNING_S": ("0.5", 0.5, "soon"),
    "FERRY_EXIT_WITH_PARENT": ("1", True, "yes"),
    "FERRY_TRAINER_PID": ("4242", 4242, "pid"),
    "FERRY_TRANSFORM": ("m:f", "m:f", None),
    "FERRY_METRICS_PORT": ("9100", 9100, "http"),
    "FERRY_SHARED_MEMORY": ("tok:/memfd:slab", ("/memfd:slab", "tok"), "no-token"),
    "FERRY_SEED": ("-3", -3, "random"),
    "FERRY_INIT": ("m:g", "m:g", None),
    "FERRY_COLLATE": ("m:h", "m:h", None),
    "FERRY_COLLATE_ARGS": ('{"alpha": 0.2}', {"alpha": 0.2}, '["alpha"]'),
    "FERRY_TRANSFORM_ARGS": ('{"size": [3, 4]}', {"size": [3, 4]}, "size=3"),
    "FERRY_COMPRESSION": ("LZ4", "lz4", "gzip"),
    "FERRY_CURVE_KEY": ("k.key_secret", "k.key_secret", None),
    "FERRY_CURVE_SERVER_KEY": ("server.key", "server.key", None),
    "FERRY_WORKER": ("1/3", (1, 3), "3/3"),
    "FERRY_LOG_LEVEL": ("debug", "DEBUG", "loud"),
    "FERRY_LOG_FORMAT": ("JSON", "json", "xml"),
    "FERRY_RESOLVE_INTERVAL": ("2.5", 2.5, "often"),
    "FERRY_STATUS_FILE": ("/tmp/s.json", "/tmp/s.json", None),
    "FERRY_STUCK_AFTER": ("30", 30.0, "long"),
    "FERRY_EXIT_WHEN_STUCK": ("0", 0.0, "never"),
    "FERRY_DRAIN_TIMEOUT": ("1.5", 1.5, "soon"),
    "FERRY_TORCH_THREADS": ("2", 2, "many"),
    "FERRY_SEED_PER_SAMPLE": ("0", False, "yes"),
}


def test_the_variables_listed_here_are_every_declared_one():
    assert set(VARIABLES) == set(PRODUCER_ENV)


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_variable_parses_or_is_an_error_naming_it(name):
    text, value, bad = VARIABLES[name]
    assert read_env({name: text}) == {name: value}
    assert read_env({name: "  "}) == {}  # empty: unset
    if bad is not None:
        with pytest.raises(ConfigError, match="^" + re.escape(f"environment variable {name}={bad!r} is not ")):
            read_env({name: bad})


CONFIGS = [
    ProducerConfig(endpoints=("ipc:///tmp/ferry-x/consumer.sock",), dataset="synthetic"),
    ProducerConfig(
        endpoints=("tcp://127.0.0.1:5555", "tcp://10.0.0.2:6000"), dataset="tests.datasets:PairDataset",
        dataset_args={"length": 10, "shape": [2, 3], "name": "7", "ratio": 0.1, "on": True, "none": None,
                      "nested": {"a": [1, "x=y"]}},
        threads=7, slots=3, heartbeat=0.25, liveness=9, unreachable_warning_s=0.3, exit_with_parent=True,
        transform="tests.transforms:double", metrics_port=9100, shared_memory=("/memfd:ferry (deleted)", "tok"),
        seed=-5, worker_id=2, num_workers=3, init="m:f", collate="m:g", compression="none",
        resolve_interval=0.0, status_file="/tmp/ferry-x/status.json", stuck_after=7.5, drain_timeout=0.25,
        allow_dataset=("tests.datasets:DictDataset", "m:h"), torch_threads=3,
    ),
    ProducerConfig(endpoints=("tcp://h:1",), dataset="synthetic", heartbeat=1 / 3, seed=0, compression="auto"),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_written_as_a_command_line_reads_back_the_same(config):
    argv, env = command_line(config, log_level="WARNING")
    assert all(name in PRODUCER_ENV for name in env)
    parsed_env = read_env(env)
    args = vars(build_parser(env=parsed_env).parse_args(argv))
    assert args["log_level"] == "WARNING"
    assert config_from_command_line(command_line_values(args, parsed_env)) == config


def test_only_what_differs_from_the_default_is_written():
    argv, env = command_line(CONFIGS[0])
    assert argv == ["--connect", "ipc:///tmp/ferry-x/consumer.sock", "--dataset", "synthetic"] and env == {}
    argv, env = command_line(CONFIGS[1], log_level="WARNING")
    assert "--seed=-5" in argv and env["FERRY_WORKER"] == "2/3" and env["FERRY_EXIT_WITH_PARENT"] == "1"


def test_what_no_command_line_can_say_is_an_error():
    with pytest.raises(ConfigError, match="callable"):
        command_line(ProducerConfig(endpoints=("tcp://h:1",), dataset="synthetic", transform=math.sqrt))
    with pytest.raises(ConfigError, match="must be JSON values"):
        command_line(ProducerConfig(endpoints=("tcp://h:1",), dataset="synthetic", dataset_args={"root": object()}))
    with pytest.raises(ConfigError, match="--curve-key"):
        command_line(ProducerConfig(endpoints=("tcp://h:1",), dataset="synthetic", curve=object()))


def test_a_flag_wins_over_its_variable_and_dataset_args_merge():
    env = read_env({"FERRY_THREADS": "3", "FERRY_CONNECT": "tcp://a:1", "FERRY_DATASET": "synthetic",
                    "FERRY_DATASET_ARGS": '{"length": 4, "shape": [2]}'})
    args = vars(build_parser(env=env).parse_args(["--threads", "5", "--dataset-arg", "length=6"]))
    config = config_from_command_line(command_line_values(args, env))
    assert config.threads == 5 and config.endpoints == ("tcp://a:1",) and config.dataset_args == {"length": 6,
                                                                                                "shape": [2]}
    args = vars(build_parser(env=env).parse_args(["--connect", "tcp://b:2"]))
    assert config_from_command_line(command_line_values(args, env)).endpoints == ("tcp://b:2",)


# --- local mode ---------------------------------------------------------------------------------------
def test_producers_started_by_spec_take_only_the_loaders_options(monkeypatch):
    # each of these would stop (or reconfigure) a producer that read it from the trainer's environment
    monkeypatch.setenv("FERRY_SLOTS", "abc")
    monkeypatch.setenv("FERRY_COMPRESSION", "gzip")
    monkeypatch.setenv("FERRY_DATASET_ARGS", '{"length": 1000}')
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 10, "shape": [2]}, local_producers=1, batch_size=5,
                      producer_threads=1, timeout=60, log_every=None) as loader:
        assert len(loader) == 2
        assert [len(y) for _, y in loader] == [5, 5]
