"""The hyperparameters block: typed specs, one-line errors naming the field, grids."""

from __future__ import annotations

import math
from typing import Any

import pytest

from determined_launch import hparams as hp
from determined_launch.errors import EXIT_USAGE, LaunchError

BLOCK: dict[str, Any] = {
    "lr": {"type": "log", "minval": -4, "maxval": -1},
    "layers": {"type": "int", "minval": 1, "maxval": 4, "count": 2},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    "batch": {"type": "const", "val": 32},
    "name": "plain",
    "opt": {"beta": {"type": "const", "val": 0.9}, "eps": 1e-8, "inner": {"k": [1, 2]}},
}


def test_parse_types_and_nesting() -> None:
    space = hp.parse_hyperparameters(BLOCK)
    assert space["lr"] == hp.Log(-4.0, -1.0, 10.0, None)
    assert space["layers"] == hp.Int(1, 4, 2)
    assert space["dropout"] == hp.Double(0.0, 0.5)
    assert space["act"] == hp.Categorical(("relu", "tanh"))
    assert space["batch"] == hp.Const(32)
    assert space["name"] == hp.Const("plain")
    assert space["opt"] == {"beta": hp.Const(0.9), "eps": hp.Const(1e-8),
                            "inner": {"k": hp.Const([1, 2])}}
    paths = [p for p, _ in hp.leaves(space)]
    assert paths == ["lr", "layers", "dropout", "act", "batch", "name", "opt.beta", "opt.eps",
                     "opt.inner.k"]


def test_constants_and_build() -> None:
    consts = {"a": 1, "b": {"type": "const", "val": "x"}, "g": {"c": None, "d": [1]}}
    assert hp.constants(hp.parse_hyperparameters(consts)) == {
        "a": 1, "b": "x", "g": {"c": None, "d": [1]}}
    assert hp.constants(hp.parse_hyperparameters(None)) == {}
    space = hp.parse_hyperparameters(BLOCK)
    with pytest.raises(hp.NotConstantError) as err:
        hp.constants(space)
    assert str(err.value).startswith("hyperparameters.lr: is a log range, not a constant")
    assert err.value.field == "hyperparameters.lr"
    nested = hp.parse_hyperparameters({"a": 1, "g": {"x": {"type": "int", "minval": 0,
                                                            "maxval": 1}}})
    with pytest.raises(hp.NotConstantError, match=r"^hyperparameters\.g\.x: is an int range"):
        hp.constants(nested)
    built = hp.build(space, {"lr": 0.01, "layers": 2, "dropout": 0.1, "act": "tanh"})
    assert built["opt"] == {"beta": 0.9, "eps": 1e-8, "inner": {"k": [1, 2]}}
    assert built["lr"] == 0.01 and built["batch"] == 32


@pytest.mark.parametrize("block, message", [
    ({"lr": {"type": "double", "minval": 0.1, "maxval": 0.01}},
     "hyperparameters.lr: minval 0.1 > maxval 0.01"),
    ({"g": {"n": {"type": "int", "minval": 5, "maxval": 2}}},
     "hyperparameters.g.n: minval 5 > maxval 2"),
    ({"lr": {"type": "float", "minval": 0, "maxval": 1}},
     "hyperparameters.lr.type: unknown type 'float'"),
    ({"lr": {"type": "double", "minval": 0}}, "hyperparameters.lr: missing maxval"),
    ({"lr": {"type": "double", "minval": 0, "maxval": 1, "step": 2}},
     "hyperparameters.lr: unknown field(s) step for type double"),
    ({"n": {"type": "int", "minval": 0.5, "maxval": 2}},
     "hyperparameters.n.minval: expected an integer, got 0.5"),
    ({"n": {"type": "double", "minval": "a", "maxval": 2}},
     "hyperparameters.n.minval: expected a finite number, got 'a'"),
    ({"n": {"type": "double", "minval": 0, "maxval": math.inf}},
     "hyperparameters.n.maxval: expected a finite number"),
    ({"n": {"type": "int", "minval": 0, "maxval": 2, "count": 0}},
     "hyperparameters.n.count: expected a positive integer, got 0"),
    ({"n": {"type": "log", "minval": 0, "maxval": 2, "base": 1}},
     "hyperparameters.n.base: expected a positive number other than 1"),
    ({"c": {"type": "categorical", "vals": []}},
     "hyperparameters.c.vals: expected a non-empty list, got list"),
    ({"c": {"type": "categorical", "vals": "ab"}},
     "hyperparameters.c.vals: expected a non-empty list, got str"),
    ([1, 2], "hyperparameters: expected a mapping of names to specs, got list"),
    ({1: 2}, "hyperparameters: hyperparameter names must be non-empty strings, got 1"),
])
def test_bad_specs_are_one_line_naming_the_field(block: Any, message: str) -> None:
    with pytest.raises(LaunchError) as err:
        hp.parse_hyperparameters(block)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    assert err.value.exit_status == EXIT_USAGE


def test_grid_values_follow_determined() -> None:
    assert hp.grid_values(hp.Double(0.001, 0.1, 3)) == pytest.approx([0.001, 0.0505, 0.1])
    assert hp.grid_values(hp.Double(0.0, 1.0, 1)) == [0.5]
    assert hp.grid_values(hp.Int(1, 3, 10)) == [1, 2, 3]
    assert hp.grid_values(hp.Int(0, 10, 3)) == [0, 5, 10]
    assert hp.grid_values(hp.Log(-3, -1, 10, 3)) == pytest.approx([1e-3, 1e-2, 1e-1])
    assert hp.grid_values(hp.Categorical((1, "a"))) == [1, "a"]
    assert hp.grid_values(hp.Const(7)) == [7]
    with pytest.raises(hp.HParamError, match="^hyperparameters.x: a grid search needs a count"):
        hp.grid_values(hp.Double(0, 1), "hyperparameters.x")
