"""The guest agent's lifecycle event (VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE), typed.

libvirt sends REMOTE_PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE (348) when the guest opens or closes
the agent's virtio channel (org.qemu.guest_agent.0), and once at a domain's start when the channel is
already open. The generated struct carries plain ints; this is the same message with libvirt's enums,
so a consumer compares with AgentLifecycleState.CONNECTED rather than 1. A value this code does not know
(a later libvirt's) stays an int: the event is still delivered, and equals no known member.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import AgentLifecycleReason, AgentLifecycleState
from .types import Domain, DomainEventCallbackAgentLifecycleMsg


@dataclass(frozen=True, slots=True)
class AgentLifecycleEvent:
    callback_id: int
    dom: Domain
    state: AgentLifecycleState | int
    reason: AgentLifecycleReason | int

    @classmethod
    def from_msg(cls, msg: DomainEventCallbackAgentLifecycleMsg) -> AgentLifecycleEvent:
        state: AgentLifecycleState | int = msg.state
        reason: AgentLifecycleReason | int = msg.reason
        if msg.state in AgentLifecycleState.__members__.values():
            state = AgentLifecycleState(msg.state)
        if msg.reason in AgentLifecycleReason.__members__.values():
            reason = AgentLifecycleReason(msg.reason)
        return cls(msg.callback_id, msg.dom, state, reason)
