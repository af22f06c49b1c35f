"""The refusal of a plug-in option no running plug-in takes says what it is: an option of HFA, which the job does
not run, or a misspelt option of some plug-in.

Why: ``training: {sync: dist_async, fragments: 2}`` (streaming HFA's option without an ``hfa:`` block) was refused
with "taken by no plug-in of this job; dist_ssp takes staleness (int)", which names neither HFA nor the way out.
"""

from __future__ import annotations

import pytest

from geomx.config import ConfigError, TrainingSpec
from geomx.config.topology import HFASpec, PartySpec, Topology
from geomx.server.compose import check_plugins

PARTIES = (PartySpec("dc0", 1), PartySpec("dc1", 1))


def _refusal(options: tuple[tuple[str, str], ...], topology: Topology) -> str:
    with pytest.raises(ConfigError) as refused:
        check_plugins(TrainingSpec(sync="dist_async", plugin_options=options), topology)
    return str(refused.value)


def test_an_hfa_option_without_hfa_names_hfa_and_the_way_to_turn_it_on() -> None:
    text = _refusal((("fragments", "2"), ("quorum", "1")), Topology(parties=PARTIES, central="dc0"))
    assert "fragments, quorum are options of the hfa aggregation, which this job does not run" in text
    assert "add an `hfa:` block" in text


def test_a_misspelt_option_gets_a_guess() -> None:
    with_hfa = Topology(parties=PARTIES, central="dc0", hfa=HFASpec(k1=2, k2=2))
    assert "did you mean 'fragments' for 'fragmnets'?" in _refusal((("fragmnets", "2"),), with_hfa)
    assert "did you mean 'staleness' for 'stalenes'?" in _refusal((("stalenes", "2"),), with_hfa)
    check_plugins(TrainingSpec(plugin_options=(("fragments", "2"),)), with_hfa)  # HFA takes it


def test_an_unreadable_value_names_its_owner_once() -> None:
    """Why: "dist_ssp: option 'staleness' of dist_ssp must be an integer" said the owner twice."""
    with pytest.raises(ConfigError) as refused:
        check_plugins(TrainingSpec(sync="dist_ssp", plugin_options=(("staleness", "abc"),)))
    assert str(refused.value) == "option 'staleness' of dist_ssp must be an integer, got 'abc'"
    with_hfa = Topology(parties=PARTIES, central="dc0", hfa=HFASpec(k1=2, k2=2))
    with pytest.raises(ConfigError) as refused:
        check_plugins(TrainingSpec(plugin_options=(("quorum", "x"),)), with_hfa)
    assert str(refused.value) == "option 'quorum' of the hfa aggregation must be an integer, got 'x'"


def test_grace_takes_a_duration_as_every_other_setting_does() -> None:
    """Why: ``GEOMX_GRACE=500ms`` was refused ("grace must be auto or seconds"), where timeouts and dgt.deadline
    take '25ms'."""
    from geomx.algorithms.hfa.quorum import decoupled_options

    assert decoupled_options({"quorum": "1", "grace": "500ms"}, 2).grace == 0.5
    assert decoupled_options({"quorum": "1", "grace": "0.25"}, 2).grace == 0.25
    assert decoupled_options({"quorum": "1", "grace": "auto"}, 2).grace is None
