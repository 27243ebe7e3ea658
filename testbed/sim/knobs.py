"""A simulated host's knobs: set at start (a JSON file) and at run time (the control socket).

Each is a plain field with its unit in the name where it has one; `Knobs.update` refuses a name it does
not know or a value of the wrong type, naming the field, so a typo in a benchmark fails loudly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass
class Knobs:
    boot_delay_s: float = 1.0  # from a domain start until its guest has an address and serves its proxy
    rpc_latency_s: float = 0.0  # network round trip: packets from a client arrive this late (holds no slot)
    start_service_s: float = 0.0  # the daemon's own time for a domain start (holds the call's slot)
    max_client_requests: int = 5  # calls in service per connection; the rest wait unread (libvirtd.conf)
    keepalive_interval_s: float = 5.0  # the daemon PINGs a client it heard nothing from (0: never)
    keepalive_count: int = 5  # unanswered PINGs before it closes the connection (libvirtd.conf)
    fail_rate: float = 0.0  # share of calls answered with a transient OPERATION_TIMEOUT error
    drop_rate: float = 0.0  # share of calls that make the daemon drop the connection instead of answering
    frozen: bool = False  # calls get no reply until unfrozen, each holding its slot (docs/lab.md)
    pool_capacity_bytes: int = 100 * GIB
    memory_bytes: int = 16 * GIB
    default_proxy_port: int = 3128  # a guest whose user-data names no `Port N` serves its proxy here
    agent: bool = True  # guests report their address through the guest agent (else ARP only)
    arp_broken: bool = False  # libvirt's ARP source fails ("wrong nlmsg len", docs/lab.md quirk 2)
    malformed_events: int = 0  # the next N event messages go out with their body cut short (a daemon's bug)

    def update(self, values: dict[str, Any]) -> None:
        fields = {f.name: f for f in dataclasses.fields(self)}
        for name, value in values.items():
            if name not in fields:
                raise ValueError(f"knob {name!r}: unknown (known: {', '.join(sorted(fields))})")
            kind = type(getattr(self, name))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not kind or (kind in (int, float) and value < 0):
                sign = "non-negative " if kind in (int, float) else ""
                raise ValueError(f"knob {name!r}: {value!r} is not a {sign}{kind.__name__}")
            if name.endswith("_rate") and value > 1:
                raise ValueError(f"knob {name!r}: {value!r} is not a share in 0..1")
            if name == "max_client_requests" and value < 1:
                raise ValueError(f"knob {name!r}: {value!r} is not at least 1 (libvirtd has no value for "
                                 "unlimited; a large number serves as one)")
        for name, value in values.items():
            setattr(self, name, float(value) if type(getattr(self, name)) is float else value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
