"""``Rates`` (``ibmon.track.rates``) must behave exactly like the dict it replaced in ``PortView``:
the same keys in the same order, the same values, lookups, membership and equality with the
dict (both ways), for any counters with and without a rate."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibmon.track.rates import NO_RATE, Rates

names = st.lists(st.text(min_size=1, max_size=12), unique=True, max_size=40)
rate = st.one_of(st.none(), st.floats(allow_nan=False))


@given(st.data(), names)
def test_rates_behave_as_the_dict_of_the_counters_that_have_one(
    data: st.DataObject, counters: list[str]
) -> None:
    values = [data.draw(rate) for _ in counters]
    rates = Rates({n: i for i, n in enumerate(counters)},
                  array("d", [NO_RATE if v is None else v for v in values]))
    expected = {n: v for n, v in zip(counters, values, strict=True) if v is not None}
    assert list(rates) == list(expected)
    assert list(rates.items()) == list(expected.items())
    assert len(rates) == len(expected)
    assert rates == expected
    assert expected == rates
    assert dict(rates) == expected
    assert repr(rates) == repr(expected)
    assert json.dumps(dict(rates)) == json.dumps(expected)
    for n in [*counters, "not-a-counter"]:
        assert (n in rates) == (n in expected)
        assert rates.get(n) == expected.get(n)
        assert rates.get(n, -1.0) == expected.get(n, -1.0)
        if n in expected:
            assert rates[n] == expected[n]
        else:
            with pytest.raises(KeyError):
                rates[n]
    if expected:  # a different value anywhere makes them differ
        assert rates != {**expected, next(iter(expected)): "another value"}
    assert rates != {**expected, "not-a-counter": 0.0}
