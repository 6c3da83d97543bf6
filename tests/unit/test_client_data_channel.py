"""The switch that keeps a client's inputs on gRPC Put (`PATHWAYS_CLIENT_DATA_CHANNEL`)."""

from __future__ import annotations

import pytest

from pathways.host_data import data_channel_wanted


def test_the_data_channel_is_on_unless_switched_off() -> None:
    assert data_channel_wanted({})
    assert data_channel_wanted({"PATHWAYS_CLIENT_DATA_CHANNEL": "on"})
    assert data_channel_wanted({"PATHWAYS_CLIENT_DATA_CHANNEL": " ON "})
    assert not data_channel_wanted({"PATHWAYS_CLIENT_DATA_CHANNEL": "off"})


def test_a_switch_that_is_neither_on_nor_off_names_the_variable_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"PATHWAYS_CLIENT_DATA_CHANNEL='no' is neither on nor off; set it to on"):
        data_channel_wanted({"PATHWAYS_CLIENT_DATA_CHANNEL": "no"})
