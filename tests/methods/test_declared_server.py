"""A method's server declaration (``strategies.declared.ServerSide``) is checked when it is
made: the names its parts send and read are those of a ``protocol.traffic`` family, in order;
what it sums is sent by its clients; a plain mean sums nothing; one part at most forms the
model; the keys its parts read are declared. And the one generic Strategy takes its facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from protocol.keys import Key
from protocol.traffic import CONTROL_VARIATES, SMOO, Traffic
from strategies.base import MEAN_OF_WEIGHTS, REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import ControlVariates, Drift


@dataclass(frozen=True)
class Sends:
    """A part that sends and reads the groups it is given."""

    SENDS: tuple[str, ...] = ()
    READS: tuple[str, ...] = ()
    AGGREGATES: ClassVar[bool] = False

    def keys_read(self) -> tuple[str, ...]:
        return ()


def declare(**fields) -> ServerSide:
    return ServerSide(**{"name": "Probe", "screening": REPLIES_ONLY, "reply_sums": (), **fields})


def test_a_consistent_declaration_is_made():
    server = declare(parts={"cv": ControlVariates()}, traffic=CONTROL_VARIATES, reply_sums=("delta_c",))
    assert server.model_part == "" and not server.uniform_mean


@pytest.mark.parametrize("fields, words", [
    ({"parts": {"x": Sends(("c",), ("delta_cc",))}, "traffic": CONTROL_VARIATES}, "read ['delta_cc']"),
    ({"parts": {"x": Sends(("cc",), ("delta_c",))}, "traffic": CONTROL_VARIATES}, "send ['cc']"),
    ({"parts": {"x": Sends(("c",), ("delta_c",))}, "traffic": SMOO}, "its traffic is"),
    ({"parts": {"x": Sends(("c",), ("delta_c",))}}, "its traffic is"),
    ({"parts": {"x": Sends(("d",), ("e",))}, "traffic": Traffic(("d",), ("e",))}, "not one of protocol.traffic"),
    ({"parts": {"cv": ControlVariates()}, "traffic": CONTROL_VARIATES, "reply_sums": ("stil",)}, "it sums ['stil']"),
])
def test_an_undeclared_or_mismatched_traffic_name_is_refused(fields, words):
    with pytest.raises(ValueError, match="the server declaration of Probe") as err:
        declare(**fields)
    assert words in str(err.value)


def test_a_plain_mean_sums_nothing_and_one_part_forms_the_model():
    drift = Drift(alpha="a", metric="m")
    keys = {"a": Key(0.1)}
    with pytest.raises(ValueError, match="plain mean over clients"):
        declare(parts={"memory": drift}, keys=keys, reply_sums=())
    with pytest.raises(ValueError, match="more than one part forms the model"):
        declare(parts={"one": drift, "two": drift}, keys=keys, reply_sums=None)
    assert declare(parts={"memory": drift}, keys=keys, reply_sums=None).uniform_mean


def test_a_key_a_part_reads_must_be_declared():
    with pytest.raises(ValueError, match=r"read keys it does not declare: \['feddyn-alpha'\]"):
        declare(parts={"memory": Drift(alpha="feddyn-alpha", metric="m")}, reply_sums=None)


def test_the_strategy_class_takes_the_declaration_s_facts_in_its_own_body():
    class Probe(DeclaredStrategy):
        SERVER = declare(screening=MEAN_OF_WEIGHTS, keys={"probe-k": Key(1)})

    assert {name: vars(Probe)[name] for name in ("SCREENING", "REPLY_SUMS", "UNIFORM_MEAN", "CONFIG_KEYS")} == {
        "SCREENING": MEAN_OF_WEIGHTS, "REPLY_SUMS": (), "UNIFORM_MEAN": False, "CONFIG_KEYS": {"probe-k": Key(1)}}
    with pytest.raises(TypeError, match="declares no SERVER"):
        type("Undeclared", (DeclaredStrategy,), {})
