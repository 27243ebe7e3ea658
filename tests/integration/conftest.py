"""The KVM provider's integration tests run twice: against real libvirtd and against the simulator.

Their test functions are unchanged; this parametrizes their `lab`/`lab_host` (tests/conftest.py) over
`hypervisor` = "libvirtd" and "simulated". That the simulated host passes the same assertions is the
simulator's fidelity claim (with test_sim_fidelity.py's call-by-call comparison); where it cannot
match, SIMULATOR_CANNOT says which test and why, and that test is an expected failure there (strict:
it fails the run if the simulator starts passing it, so the list stays true).
"""

from __future__ import annotations

import pytest

#: Modules whose lab tests run against both hypervisors.
BOTH = ("test_kvm_provider", "test_kvm_preflight", "test_kvm_orphan_volumes", "test_client_requests")

#: test name -> why the simulated host cannot pass it as written.
SIMULATOR_CANNOT: dict[str, str] = {
    "test_preflight_fails_on_an_inactive_pool":
        "the simulated host has one pool, `default`: defining another (virsh pool-define-as, "
        "STORAGE_POOL_DEFINE_XML) is not simulated; an inactive pool is the model's pool_active=False, "
        "covered by the unit tests over the same model",
}


@pytest.fixture(scope="session")
def sim_lab_host(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The simulated lab's hosts (beside `lab_host`, for tests that compare the two)."""
    return request.getfixturevalue("_session_sim_lab").get(image=False)


@pytest.fixture(scope="session")
def sim_lab(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The simulated lab with the test image served (for tests of the simulator's own knobs)."""
    return request.getfixturevalue("_session_sim_lab").get(image=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in BOTH and {"lab", "lab_host"} & set(metafunc.fixturenames):
        params = [pytest.param("libvirtd", id="libvirtd")]
        reason = SIMULATOR_CANNOT.get(metafunc.function.__name__)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param("simulated", id="simulated", marks=marks))
        metafunc.parametrize("hypervisor", params, indirect=True, scope="session")
