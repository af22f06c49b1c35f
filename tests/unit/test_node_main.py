"""``python -m geomx.node`` ends quietly when the launcher stops it early: a SIGTERM while the node still reads its
config or imports its parts is Ctrl-C's exit (130), not a traceback (a job whose worker failed at start printed six)."""

from __future__ import annotations

import pytest

from geomx import node


def _interrupted() -> None:
    raise KeyboardInterrupt  # what node._terminate raises on SIGTERM


@pytest.fixture
def quiet_main(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node.signal, "signal", lambda *_args: None)  # not this test process's handler
    monkeypatch.setattr(node, "configure_logging", lambda *_args: None)


def test_a_sigterm_while_the_node_reads_its_config_exits_130(quiet_main: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "node_config", _interrupted)
    assert node.main() == 130


def test_a_sigterm_while_the_node_starts_exits_130(quiet_main: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "node_config", lambda: object())
    monkeypatch.setattr(node, "run_node", lambda _config: _interrupted())
    assert node.main() == 130
