"""The ADD's last check (engine_client/validation.py): its one-expression fast path for the float fields accepts
exactly what the field-by-field checks accept, and a refusal still names the field."""

from __future__ import annotations

import itertools
import math
import random

import msgspec
import pytest

from pyfront.engine_client.protocol import SamplingParams
from pyfront.engine_client.validation import _FLOAT_RANGES, _check_float, validate_sampling_params

_EDGES = [-3.0, -2.0, -1.0, -0.0, 0.0, 1e-300, 0.5, 1.0, 1.5, 2.0, 2.0000001, 1e300, math.inf, -math.inf, math.nan]
_OTHERS: list[object] = [0, 1, 2, -2, True, False, None, "1.0"]


def _accepted_field_by_field(values: dict[str, object]) -> bool:
    try:
        for name, low, high, low_open in _FLOAT_RANGES:
            _check_float(name, values[name], low, high, low_open=low_open)
    except ValueError:
        return False
    return True


def _params(values: dict[str, object]) -> SamplingParams:
    base = SamplingParams(max_tokens=16)
    return msgspec.structs.replace(base, **values)


def test_the_fast_path_accepts_exactly_what_the_checks_accept() -> None:
    defaults = {name: getattr(SamplingParams(max_tokens=16), name) for name, *_ in _FLOAT_RANGES}
    cases = []
    for name, *_ in _FLOAT_RANGES:  # one field off its default: every edge and every non-float
        cases += [{**defaults, name: value} for value in [*_EDGES, *_OTHERS]]
    rng = random.Random(0)
    pool = [*_EDGES, *_OTHERS, *(rng.uniform(-3, 3) for _ in range(20))]
    cases += [{name: rng.choice(pool) for name, *_ in _FLOAT_RANGES} for _ in range(3000)]
    accepted = 0
    for values in cases:
        expected = _accepted_field_by_field(values)
        try:
            validate_sampling_params(_params(values))
            got = True
        except ValueError:
            got = False
        assert got == expected, values
        accepted += got
    assert 0 < accepted < len(cases)


@pytest.mark.parametrize(
    ("name", "value"), list(itertools.product([n for n, *_ in _FLOAT_RANGES], [math.nan, -5.0, "x"]))
)
def test_a_refusal_names_its_field(name: str, value: object) -> None:
    values = {name: value}
    with pytest.raises(ValueError, match=name):
        validate_sampling_params(_params(values))
