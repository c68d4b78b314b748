"""connect()'s options (gradswitch.ConnectOptions): one documented object holds every default.

connect() keeps its signature (every call that worked still does, with the same values reaching the
native Group) and takes the arguments it is not given from `options=` or else from ConnectOptions().
The native Group is replaced by a recorder here, so no switch is needed: what these tests check is
what connect() hands to it. docs/python.md lists every option with its default; the test keeps the
two in step.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import gradswitch
from gradswitch import _group

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
# What connect() hands to the native Group when called with no arguments at all (main's behaviour).
NATIVE_DEFAULTS = {
    "switch": "127.0.0.1:7700",
    "job": "default",
    "rank": 0,
    "world_size": 1,
    "wire": "float32",
    "timeout": 30.0,
    "drop_rate": 0.0,
    "seed": 0,
    "token": "",
    "join_timeout": 120.0,
    "connect_timeout": 5.0,
    "shuffle_seed": 0,
    "optimizer": "",
    "params": 0,
    "optimizer_keys": [],
    "algorithm": "switch",
    "peers": [],
    "peer_exchange": None,
    "bind_ip": "",
    "tenant": "",
    "secret": "",
    "deadline_us": 0,
    "quorum": 0,
    "rescale": True,
    "straggler_report": 10,
    "concede": False,
    "concede_keep": -1.0,
}


class Recorder:
    """Stands in for gradswitch._core.Group: keeps what it was given."""

    made: list[dict] = []

    def __init__(self, switch, job, rank, world_size, **kw) -> None:
        self.args = dict(switch=switch, job=job, rank=rank, world_size=world_size, **kw)
        self.rank = rank
        Recorder.made.append(self.args)

    def close(self, abort: bool = False) -> None:
        pass


@pytest.fixture
def native(monkeypatch):
    for name in ("GRADSWITCH_TENANT", "GRADSWITCH_SECRET", "GRADSWITCH_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_group._core, "Group", Recorder)
    Recorder.made = []

    def last(**kw) -> dict:
        gradswitch.connect(**kw)
        return Recorder.made[-1]

    return last


def test_the_options_object_holds_every_argument_of_connect_with_its_default():
    names = [f.name for f in dataclasses.fields(gradswitch.ConnectOptions)]
    params = inspect.signature(gradswitch.connect).parameters
    assert list(params) == [*names, "options"]
    # help(connect) shows each default as the value it stands for.
    for f in dataclasses.fields(gradswitch.ConnectOptions):
        assert repr(params[f.name].default) == repr(f.default), f.name


def test_connect_without_arguments_hands_the_documented_defaults_to_the_native_group(native):
    assert native() == NATIVE_DEFAULTS


def test_every_call_that_worked_still_does(native):
    got = native(switch="10.0.0.1:7700", job="train", rank=1, world_size=2, wire="fixed32", timeout=3)
    assert got == {
        **NATIVE_DEFAULTS,
        "switch": "10.0.0.1:7700",
        "job": "train",
        "rank": 1,
        "world_size": 2,
        "wire": "fixed32",
        "timeout": 3.0,
    }
    gradswitch.connect("10.0.0.1:7700", "train", 1, 2)  # positionally, as before
    assert Recorder.made[-1] == {**got, "wire": "float32", "timeout": 30.0}
    got = native(switch=None, algorithm="ring", peers=("127.0.0.1:1", "127.0.0.1:2"), world_size=2, token="t")
    assert got["switch"] == "" and got["peers"] == ["127.0.0.1:1", "127.0.0.1:2"] and got["token"] == "t"


def test_options_give_the_defaults_and_arguments_override_them(native):
    base = gradswitch.ConnectOptions(switch="10.0.0.1:7700", job="train", world_size=4, wire="bfloat16")
    got = native(options=base, rank=3)
    assert got == {
        **NATIVE_DEFAULTS,
        "switch": "10.0.0.1:7700",
        "job": "train",
        "rank": 3,
        "world_size": 4,
        "wire": "bfloat16",
    }
    assert native(options=base, wire="float32", rank=0)["wire"] == "float32"
    # An argument given as its default's value still wins over options=.
    assert native(options=base, switch="127.0.0.1:7700")["switch"] == "127.0.0.1:7700"
    assert native(options=dataclasses.replace(base, rank=2))["rank"] == 2


def test_an_unknown_option_is_a_type_error_that_names_it(native):
    with pytest.raises(TypeError, match="wrie"):
        gradswitch.ConnectOptions(wrie="float32")
    with pytest.raises(TypeError, match="wrie"):
        gradswitch.connect(wrie="float32")
    with pytest.raises(TypeError, match="options= must be a gradswitch.ConnectOptions, got dict"):
        gradswitch.connect(options={"wire": "float32"})
    assert Recorder.made == []


def test_options_are_checked_as_arguments_are(native):
    for bad, error in (
        ({"wire": "float8"}, ValueError),
        ({"world_size": 0}, ValueError),
        ({"rank": True}, TypeError),
        ({"timeout": -1}, ValueError),
        ({"drop_rate": 1.0}, ValueError),
        ({"params": 4}, ValueError),
        ({"peers": "127.0.0.1:1"}, TypeError),
    ):
        with pytest.raises(error) as as_argument:
            gradswitch.connect(**bad)
        with pytest.raises(error) as as_option:
            gradswitch.connect(options=gradswitch.ConnectOptions(**bad))
        assert str(as_argument.value) == str(as_option.value), bad
    assert Recorder.made == []


def test_docs_list_every_option_with_its_default():
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", DOC.read_text(), re.MULTILINE))
    want = {f.name: repr(f.default) for f in dataclasses.fields(gradswitch.ConnectOptions)}
    assert rows == want
