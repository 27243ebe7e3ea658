"""Knobs refuse what they do not know, naming the knob; good values land with their type."""

import pytest

from testbed.sim.knobs import Knobs


def test_good_values_land_and_ints_become_seconds() -> None:
    k = Knobs()
    k.update({"boot_delay_s": 5, "fail_rate": 0.05, "frozen": True, "pool_capacity_bytes": 10})
    assert (k.boot_delay_s, k.fail_rate, k.frozen, k.pool_capacity_bytes) == (5.0, 0.05, True, 10)
    assert isinstance(k.boot_delay_s, float)


@pytest.mark.parametrize(("values", "message"), [
    ({"boot_dealy_s": 1}, "knob 'boot_dealy_s': unknown"),
    ({"boot_delay_s": "5"}, "knob 'boot_delay_s': '5' is not a non-negative float"),
    ({"rpc_latency_s": -1}, "knob 'rpc_latency_s': -1.0 is not a non-negative float"),
    ({"fail_rate": 1.5}, "knob 'fail_rate': 1.5 is not a share in 0..1"),
    ({"frozen": 1}, "knob 'frozen': 1 is not a bool"),
    ({"memory_bytes": 1.5}, "knob 'memory_bytes': 1.5 is not a non-negative int"),
    ({"max_client_requests": 0}, "knob 'max_client_requests': 0 is not at least 1"),
])
def test_bad_values_are_refused_naming_the_knob_and_nothing_changes(values: dict[str, object],
                                                                    message: str) -> None:
    k = Knobs()
    with pytest.raises(ValueError) as err:
        k.update({"boot_delay_s": 9.0, **values})
    assert str(err.value).startswith(message)
    assert k == Knobs()
