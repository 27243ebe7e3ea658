"""What the reconciler remembers about a Proxy between reconciles, in one place with one `forget`.

Everything here is a cache of what a reconcile concluded: losing it (a restart, a new leader) costs at
most one repeated Event or one early retry, never a wrong phase, since status holds what must survive.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from egress_kvm.kube.interfaces import Key

from .desired import Desired, DesiredKey


@dataclass
class KeyState:
    # (generation, providers hash) of a Failed verdict: not retried while both are unchanged.
    failed: tuple[int, str] | None = None
    phase: str | None = None  # last phase written, for the per-phase gauge
    # Starts since the instance was last Ready: a guest that keeps stopping (a crash at boot) is started
    # again on a growing delay, with an Event on the 1st, 2nd, 4th, 8th... start only.
    restarts: int = 0
    # (reason, message) of the retryable trouble the last reconcile ended in: the same trouble again
    # records no second Event, and a quota retry does not first rewrite "creating ...".
    trouble: tuple[str, str] | None = None
    ip_waits: int = 0  # looks in a row at the instance running without an IP
    stranded_looks: int = 0  # looks in a row at the instance stranded (Instance.stranded; plan.py)
    importing: bool = False  # the last reconcile waited on a background image import (status shows it)
    # The desired instance a fresh pass computed from inline user-data, without the user-data, and what it
    # was computed from: a routine pass from the informer's cache, which holds no inline user-data,
    # reuses it while the inputs are the same (reconciler.py).
    desired: tuple[DesiredKey, Desired] | None = None


class Memory:
    def __init__(self) -> None:
        self._states: dict[Key, KeyState] = {}

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
        return key in self._states

    def forget(self, key: Key) -> None:
        self._states.pop(key, None)

    def forget_failed(self) -> None:
        """A providers-file change may cure any Failed Proxy."""
        for state in self._states.values():
            state.failed = None

    def phase_counts(self) -> Counter[str]:
        return Counter(s.phase for s in self._states.values() if s.phase is not None)
