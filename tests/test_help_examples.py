"""Issue 11, item 9: the examples in `ferry --help` bind a private address, as the security section advises."""

import re

from ferry.cli import EPILOG, build_parser


def test_ferry_help_examples_bind_a_private_address():
    text = build_parser().format_help()
    assert EPILOG.splitlines()[0] in text
    endpoints = re.findall(r"tcp://[^\s\"']+", text)
    assert endpoints, text
    for endpoint in endpoints:
        assert not endpoint.startswith("tcp://*") and not endpoint.startswith("tcp://0.0.0.0"), endpoint
    assert 'RemoteLoader(endpoint="tcp://10.0.0.5:5555"' in text


def test_demo_help_suggests_a_private_endpoint():
    demo = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
    assert "tcp://*" not in demo and "tcp://10.0.0.5:5555" in demo
