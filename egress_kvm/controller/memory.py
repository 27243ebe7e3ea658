"""What the reconciler remembers about a Proxy between reconciles, in one place with one `forget`.

Everything here is a cache of what a reconcile concluded: losing it (a restart, a new leader) costs at
most one repeated Event or one early retry, never a wrong phase, since status holds what must survive.

The last phase written per key is kept beside the states with its counts per phase, moved only where
a phase changes (`set_phase`, `forget`): the per-phase gauge is refreshed after every reconcile, and a
recount over every Proxy each time made a ramp of N Proxies cost O(N^2) (issue 8).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from egress_kvm.kube.interfaces import Key

from .desired import Desired, DesiredKey


@dataclass(slots=True)  # slots: a stray `state.phase = ...` fails instead of bypassing the counts
class KeyState:
    # (generation, providers hash) of a Failed verdict: not retried while both are unchanged.
    failed: tuple[int, str] | None = None
    # Starts since the instance was last Ready: a guest that keeps stopping (a crash at boot) is started
    # again on a growing delay, with an Event on the 1st, 2nd, 4th, 8th... start only.
    restarts: int = 0
    # (reason, message) of the retryable trouble the last reconcile ended in: the same trouble again
    # records no second Event, and a quota retry does not first rewrite "creating ...".
    trouble: tuple[str, str] | None = None
    ip_waits: int = 0  # looks in a row at the instance running without an IP
    stranded_looks: int = 0  # looks in a row at the instance stranded (Instance.stranded; plan.py)
    importing: bool = False  # the last reconcile waited on a background image import (status shows it)
    # (provider, zone) of the host the last reconcile found unreachable, for a Proxy whose status may
    # record no instance there yet (its look found the host down before its create): the host's return
    # wakes it with the Proxies that do (manager._host_back), not its backoff grown during the outage.
    # Any other end of a fresh pass clears it; a pass from the cache leaves it (cached.py), which costs
    # at most one extra pass when that host next returns.
    waits_on: tuple[str, str] | None = None
    # The desired instance a fresh pass computed from inline user-data, without the user-data, and what it
    # was computed from: a routine pass from the informer's cache, which holds no inline user-data,
    # reuses it while the inputs are the same (reconciler.py).
    desired: tuple[DesiredKey, Desired] | None = None


class Memory:
    def __init__(self) -> None:
        self._states: dict[Key, KeyState] = {}
        self._phases: dict[Key, str] = {}  # last phase written, for the per-phase gauge
        self._counts: Counter[str] = Counter()  # == Counter(self._phases.values()), kept as they change

    def __getitem__(self, key: Key) -> KeyState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = KeyState()
        return state

    def get(self, key: Key) -> KeyState | None:
        return self._states.get(key)

    def peek(self, key: Key) -> KeyState:
        """The key's state without keeping a new one (a fresh KeyState if there is none)."""
        return self._states.get(key) or KeyState()

    def __contains__(self, key: Key) -> bool:
        return key in self._states or key in self._phases

    def __len__(self) -> int:
        """Keys remembered (a state, a phase or both): what a long-lived process holds per Proxy."""
        return len(self._states.keys() | self._phases.keys())

    def forget(self, key: Key) -> None:
        self._states.pop(key, None)
        self._count(self._phases.pop(key, None), -1)

    def waiting_on(self, provider: str, zone: str) -> list[Key]:
        """The keys whose last reconcile found `provider`/`zone` unreachable (KeyState.waits_on)."""
        return [key for key, state in self._states.items() if state.waits_on == (provider, zone)]

    def forget_failed(self) -> None:
        """A providers-file change may cure any Failed Proxy."""
        for state in self._states.values():
            state.failed = None

    def phase(self, key: Key) -> str | None:
        return self._phases.get(key)

    def set_phase(self, key: Key, phase: str) -> None:
        """The phase just written to `key`'s status."""
        old = self._phases.get(key)
        if old == phase:
            return
        self._phases[key] = phase
        self._count(old, -1)
        self._count(phase, +1)

    def phase_counts(self) -> Mapping[str, int]:
        """Keys per last phase written (phases with none left out)."""
        return dict(self._counts)

    def _count(self, phase: str | None, delta: int) -> None:
        if phase is None:
            return
        self._counts[phase] += delta
        if self._counts[phase] <= 0:
            del self._counts[phase]
