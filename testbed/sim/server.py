"""libvirtd's side of the wire for a simulated host: one `WireConnection` per client on the unix socket.

Packets are cut and classified by rpc/'s sans-IO core (PacketDecoder, classify_from_client) and every reply is
built by its encoders (encode_reply, encode_error_reply, encode_event, the stream packets), so the simulator
and the client speak from the same framing code. A packet arrives `rpc_latency_s` late (the network's round
trip, in the order sent: transit.py), then is read as libvirtd reads it: at most `max_client_requests` calls
in service per connection, the rest left unread in arrival order (slots.py); the daemon's own keepalive runs
as libvirtd's (keepalive.py). Each call read runs as its own task (libvirtd's worker pool answers out of order
too); the host's knobs freeze replies, fail or drop calls and give a domain start service time. The procedures
themselves are `Hypervisor` methods (model.py); only connection-level ones (handshake, event registration,
streams) live here.
"""

from __future__ import annotations

import asyncio
import random
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import xdrlib3

from rpc import types as t
from rpc.constants import (
    FEATURE_PROGRAM_KEEPALIVE,
    QEMU_PROGRAM,
    REMOTE_PROGRAM,
    REMOTE_PROTOCOL_VERSION,
    STREAM_CHUNK,
    AgentLifecycleReason,
    AgentLifecycleState,
    AuthType,
    DomainEventID,
    ErrorCode,
    MessageStatus,
    MessageType,
    error_code_name,
)
from rpc.errors import LibvirtError, ProtocolError
from rpc.framing import Packet, PacketDecoder, encode_packet
from rpc.messages import (
    PING,
    PONG,
    Call,
    FromClient,
    Ping,
    Pong,
    StreamAborted,
    StreamData,
    StreamFinished,
    classify_from_client,
    encode_error_reply,
    encode_event,
    encode_remote_error,
    encode_reply,
    encode_stream_finish,
    stream_data_header,
)
from rpc.procedures import (
    BY_NUMBER,
    DOMAIN,
    LIFECYCLE_MSG,
    OPT_STRING,
    POOL,
    PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE,
    STRING,
    Procedure,
)
from rpc.procedures import (
    REMOTE_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE_MSG as AGENT_LIFECYCLE_MSG,
)
from rpc.protocol_constants import (
    REMOTE_PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE as PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE,
)
from rpc.xdr import INT, UINT, Reader, Struct

from .keepalive import Keepalive, Step
from .model import Domain, Lifecycle, Upload
from .slots import Hold, Slots
from .transit import Transit

if TYPE_CHECKING:
    from .host import SimHost

ERROR_DOMAIN_RPC = 7  # VIR_FROM_RPC
ERROR_LEVEL = 2  # VIR_ERR_ERROR
#: event id -> the procedure of its messages: the events this simulator sends
EVENT_PROCS = {DomainEventID.LIFECYCLE: PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE,
               DomainEventID.AGENT_LIFECYCLE: PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE}
#: CONNECT_(UN)REGISTER_CLOSE_CALLBACK: void in, void out; not in the client's procedure table.
CLOSE_CALLBACK_PROCS = frozenset({360, 361})
#: A domain start: the call `start_service_s` keeps in service.
START_PROCS = frozenset({"DOMAIN_CREATE", "DOMAIN_CREATE_WITH_FLAGS"})
#: Calls libvirtd answers only once the domain's QEMU has answered on its monitor (of those simulated):
#: they hang while it is stopped (SimHost.stop_qemu). libvirtd's 30 s wait for a domain's job, held by
#: such a call, is not simulated.
MONITOR_PROCS = frozenset({"DOMAIN_SUSPEND", "DOMAIN_RESUME"})


QEMU_PROC_DOMAIN_AGENT_COMMAND = 3
AGENT_COMMAND_ARGS = Struct("qemu_domain_agent_command_args",
                            [("dom", DOMAIN), ("cmd", STRING), ("timeout", INT), ("flags", UINT)],
                            lambda *values: values)


def encode_ret_string(value: str | None) -> bytes:
    p = xdrlib3.Packer()
    OPT_STRING.pack(p, value)
    return p.get_buffer()


def _one(name: str, codec: object) -> Struct:
    return Struct(name, [(name, codec)], lambda v: v)  # type: ignore[list-item]


#: Procedures virsh calls that the client's table (rpc/procedures.py) does not list (yet): the table the
#: server decodes with is the client's plus these, so `virsh` on a simulated host works as on a real one.
EXTRA_PROCEDURES: dict[int, Procedure] = {p.number: p for p in (
    Procedure(151, "DOMAIN_IS_PERSISTENT", Struct("args", [("dom", DOMAIN)], tuple), _one("persistent", INT)),
    Procedure(154, "STORAGE_POOL_IS_ACTIVE", Struct("args", [("pool", POOL)], tuple), _one("active", INT)),
    Procedure(155, "STORAGE_POOL_IS_PERSISTENT", Struct("args", [("pool", POOL)], tuple),
              _one("persistent", INT)),
    Procedure(89, "STORAGE_POOL_GET_AUTOSTART", Struct("args", [("pool", POOL)], tuple),
              _one("autostart", INT)),
    Procedure(183, "DOMAIN_HAS_MANAGED_SAVE_IMAGE", Struct("args", [("dom", DOMAIN), ("flags", UINT)], tuple),
              _one("result", INT)),
)}
#: Features this daemon says yes to (CONNECT_SUPPORTS_FEATURE): those a libvirt 9 daemon has and the
#: rpc client asks about. Others answer 0, which a client reads as "not there".
SUPPORTED_FEATURES = frozenset({FEATURE_PROGRAM_KEEPALIVE, 5, 6, 8, 9, 11, 12, 13, 14, 15, 16})


def remote_error(exc: LibvirtError) -> t.RemoteError:
    return t.RemoteError(code=exc.code, domain=exc.domain, message=exc.message, level=ERROR_LEVEL, dom=None,
                         str1=exc.message, str2=None, str3=None, int1=-1, int2=-1, net=None)


def rpc_error(code: int, message: str) -> LibvirtError:
    return LibvirtError(code, error_code_name(code), ERROR_DOMAIN_RPC, message)


def transient_error() -> LibvirtError:
    return LibvirtError(ErrorCode.OPERATION_TIMEOUT, error_code_name(ErrorCode.OPERATION_TIMEOUT), 10,
                        "Timed out during operation: cannot acquire state change lock (simulated)")


class WireConnection(asyncio.Protocol):
    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.decoder = PacketDecoder()
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.uploads: dict[int, Upload | None] = {}  # serial -> upload (None once it failed)
        self.downloads: set[int] = set()
        # callback id -> (event id, domain filter)
        self.callbacks: dict[int, tuple[DomainEventID, t.Domain | None]] = {}
        self.opened = False
        knobs = host.knobs
        self.slots: Slots[Packet] = Slots(knobs.max_client_requests)
        self.keepalive = Keepalive(knobs.keepalive_interval_s, knobs.keepalive_count,
                                   last_heard=asyncio.get_running_loop().time())
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self.transit: Transit[Packet] = Transit()  # packets still on the network (rpc_latency_s)
        self._transit_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.host.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.connections.discard(self)
        for task in self.tasks:
            task.cancel()
        for timer in (self._keepalive_timer, self._transit_timer):
            if timer is not None:
                timer.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except ProtocolError:
            self.close()
            return
        latency, now = self.host.knobs.rpc_latency_s, asyncio.get_running_loop().time()
        for packet in packets:
            for arrived in self.transit.send(packet, now=now, latency=latency):
                self._arrive(arrived)
        self._arm_transit()

    # -- reading: the request limit and the daemon's keepalive ----------------------------------------

    def _arm_transit(self) -> None:
        due = self.transit.next_arrival()
        if due is not None and self._transit_timer is None:
            self._transit_timer = asyncio.get_running_loop().call_at(due, self._land, due)

    def _land(self, due: float) -> None:
        self._transit_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        # the loop may run a timer a clock tick early: what it was armed for has arrived all the same
        for packet in self.transit.arrived(max(asyncio.get_running_loop().time(), due)):
            self._arrive(packet)
        self._arm_transit()

    def _arrive(self, packet: Packet) -> None:
        hold = Hold.UNTIL_ANSWERED if (packet.header.prog == QEMU_PROGRAM or
                                       packet.header.type == MessageType.CALL) else Hold.NONE
        self._serve(self.slots.arrive(packet, hold))

    def _answered(self) -> None:
        """A call's reply went out: its slot is free, and what waited unread is read now."""
        if self.transport is not None and not self.transport.is_closing():
            self._serve(self.slots.answered())

    def set_max_client_requests(self, limit: int) -> None:
        self._serve(self.slots.set_limit(limit))

    def _serve(self, packets: list[Packet]) -> None:
        for packet in packets:
            self.keepalive.heard(asyncio.get_running_loop().time())
            self._read(packet)
        if self.transport is not None and not self.transport.is_closing():
            # what is left unread stays in the socket, as in libvirtd's (the client's writes block when
            # it fills, so an upload behind busy slots waits there, not in the simulator's memory)
            if self.slots.reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _read(self, packet: Packet) -> None:
        if packet.header.prog == QEMU_PROGRAM:
            self._spawn_call(self._qemu_call(packet.header.proc, packet.header.serial, packet.payload))
            return
        try:
            msg: FromClient = classify_from_client(packet)
        except ProtocolError:
            self.close()
            return
        if isinstance(msg, Ping):
            self.send(PONG)
        elif isinstance(msg, Pong):
            pass  # a sign of life, as any packet read
        elif isinstance(msg, Call):
            self._spawn_call(self._call(msg))
        elif isinstance(msg, StreamData):
            self._upload_data(msg)
        elif isinstance(msg, StreamFinished):
            self._stream_finished(msg.serial, msg.proc)
        elif isinstance(msg, StreamAborted):
            self.uploads.pop(msg.serial, None)
            self.downloads.discard(msg.serial)
            self.send(encode_stream_finish(proc=msg.proc, serial=msg.serial))

    def _start_keepalive(self) -> None:
        self.keepalive.start(asyncio.get_running_loop().time())
        self._arm_keepalive()

    def _arm_keepalive(self) -> None:
        wake = self.keepalive.next_wakeup()
        if wake is None or self._keepalive_timer is not None:  # off, or armed already (asked twice)
            return
        if self.transport is not None and not self.transport.is_closing():
            self._keepalive_timer = asyncio.get_running_loop().call_at(wake, self._keepalive_due)

    def _keepalive_due(self) -> None:
        self._keepalive_timer = None
        step = self.keepalive.tick(asyncio.get_running_loop().time())
        if step is Step.CLOSE:
            self.close()
            return
        if step is Step.PING:
            self.send(PING)
        self._arm_keepalive()

    # -- plumbing -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _spawn_call(self, coro: Any) -> None:
        """A call read: served in its own task, whose end (its reply sent, in the same loop turn) frees
        its slot."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._answered()

    def lifecycle(self, dom: Domain, event: Lifecycle, detail: int) -> None:
        for callback_id in self._callbacks_for(DomainEventID.LIFECYCLE, dom):
            p = xdrlib3.Packer()
            LIFECYCLE_MSG.pack(p, t.LifecycleEvent(callback_id=callback_id, dom=dom.handle(),
                                                   event=int(event), detail=detail))
            self._event(PROC_DOMAIN_EVENT_CALLBACK_LIFECYCLE, p.get_buffer())

    def agent_lifecycle(self, dom: Domain, state: AgentLifecycleState, reason: AgentLifecycleReason) -> None:
        for callback_id in self._callbacks_for(DomainEventID.AGENT_LIFECYCLE, dom):
            p = xdrlib3.Packer()
            AGENT_LIFECYCLE_MSG.pack(p, t.DomainEventCallbackAgentLifecycleMsg(
                callback_id=callback_id, dom=dom.handle(), state=int(state), reason=int(reason)))
            self._event(PROC_DOMAIN_EVENT_CALLBACK_AGENT_LIFECYCLE, p.get_buffer())

    def _event(self, proc: int, body: bytes) -> None:
        """One event message; while the `malformed_events` knob counts down, its body is cut after the
        callback id and one more int: well framed, undecodable (what a client must survive)."""
        knobs = self.host.knobs
        if knobs.malformed_events:
            knobs.malformed_events -= 1
            body = body[:8]
        self.send(encode_event(proc=proc, payload=body))

    def _callbacks_for(self, event_id: DomainEventID, dom: Domain) -> list[int]:
        return [cid for cid, (eid, only) in self.callbacks.items()
                if eid == event_id and (only is None or only.uuid == dom.uuid)]

    # -- calls ----------------------------------------------------------------------------------

    async def _call(self, call: Call) -> None:
        knobs = self.host.knobs
        self.host.calls += 1
        await self.host.unfrozen.wait()
        proc = BY_NUMBER.get(call.proc) or EXTRA_PROCEDURES.get(call.proc)
        if proc is not None and proc.name in START_PROCS and knobs.start_service_s:
            await asyncio.sleep(knobs.start_service_s)
        try:
            if call.proc in CLOSE_CALLBACK_PROCS:  # virsh registers one; nothing to keep server-side
                self.send(encode_reply(proc=call.proc, serial=call.serial, payload=b""))
                return
            if proc is None:
                raise rpc_error(ErrorCode.RPC, f"unknown procedure: {call.proc}")
            if proc.number not in (66, 70, 60, 1) and knobs.drop_rate and random.random() < knobs.drop_rate:
                self.close()
                return
            if proc.number not in (66, 70, 60, 1) and knobs.fail_rate and random.random() < knobs.fail_rate:
                raise transient_error()
            args = proc.decode_args(call.payload)
            if proc.name in MONITOR_PROCS:
                await self.host.monitor(args[0].name)
            if proc.stream is not None:
                self._open_stream(proc, call, args)
                return
            result = self._dispatch(proc, args)
            self.send(encode_reply(proc=call.proc, serial=call.serial, payload=proc.encode_ret(result)))
        except LibvirtError as exc:
            self.host.errors[exc.code_name] += 1
            self.send(encode_error_reply(proc=call.proc, serial=call.serial, error=remote_error(exc)))
        except ProtocolError as exc:
            err = rpc_error(ErrorCode.RPC, f"cannot decode arguments: {exc}")
            self.send(encode_error_reply(proc=call.proc, serial=call.serial, error=remote_error(err)))
        except Exception as exc:  # a simulator bug: answer (a client must not hang on it) and say so
            traceback.print_exc()
            err = LibvirtError(ErrorCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0, f"simulator: {exc!r}")
            self.send(encode_error_reply(proc=call.proc, serial=call.serial, error=remote_error(err)))
        if proc is not None and proc.name == "CONNECT_CLOSE":
            self.close()

    async def _qemu_call(self, proc: int, serial: int, payload: bytes) -> None:
        """QEMU program calls: only the guest-agent command (virsh qemu-agent-command), by the guest."""
        status, body = MessageStatus.OK, b""
        try:
            if proc != QEMU_PROC_DOMAIN_AGENT_COMMAND:
                raise rpc_error(ErrorCode.RPC, f"unknown procedure: {proc} (QEMU program)")
            dom, command, _timeout, _flags = AGENT_COMMAND_ARGS.unpack(Reader(payload, what="agent command"))
            body = encode_ret_string(self.host.agent_command(dom, command))
        except LibvirtError as exc:
            status, body = MessageStatus.ERROR, encode_remote_error(remote_error(exc))
        except (ProtocolError, EOFError) as exc:
            err = rpc_error(ErrorCode.RPC, f"cannot decode arguments: {exc}")
            status, body = MessageStatus.ERROR, encode_remote_error(remote_error(err))
        except Exception as exc:  # a simulator bug: answer (a client must not hang on it) and say so
            traceback.print_exc()
            err = LibvirtError(ErrorCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0, f"simulator: {exc!r}")
            status, body = MessageStatus.ERROR, encode_remote_error(remote_error(err))
        self.send(encode_packet(prog=QEMU_PROGRAM, vers=1, proc=proc, type=MessageType.REPLY, serial=serial,
                                status=status, payload=body))

    def _dispatch(self, proc: Procedure, args: tuple[Any, ...]) -> Any:
        name = proc.name
        if name == "AUTH_LIST":
            return (int(AuthType.NONE),)
        if name == "CONNECT_SUPPORTS_FEATURE":
            if args[0] == FEATURE_PROGRAM_KEEPALIVE:  # asking is what turns the daemon's keepalive on
                self._start_keepalive()
            return int(args[0] in SUPPORTED_FEATURES)
        if name == "CONNECT_OPEN":
            self.opened = True
            return None
        if name == "CONNECT_CLOSE":
            return None
        if not self.opened:
            raise rpc_error(ErrorCode.INVALID_CONN, "invalid connection pointer in virConnect: not open")
        if name == "CONNECT_GET_TYPE":
            return "QEMU"
        if name == "CONNECT_GET_URI":
            return "qemu:///system"
        if name == "CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY":
            if args[0] not in EVENT_PROCS:
                raise rpc_error(ErrorCode.NO_SUPPORT, f"this simulator sends lifecycle and agent lifecycle "
                                                      f"events only (event id {args[0]})")
            callback_id = self.host.next_callback_id()
            self.callbacks[callback_id] = (DomainEventID(args[0]), args[1])
            return callback_id
        if name == "CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY":
            if self.callbacks.pop(args[0], False) is False:
                raise LibvirtError(ErrorCode.INVALID_ARG, error_code_name(ErrorCode.INVALID_ARG), 0,
                                   f"invalid argument: callback ID {args[0]} not registered")
            return None
        method: Callable[..., Any] | None = getattr(self.host.hyp, proc.method, None)
        if method is None:
            raise rpc_error(ErrorCode.NO_SUPPORT, f"this function is not supported by the simulator: "
                                                  f"{proc.method}")
        return method(*args)

    # -- streams ----------------------------------------------------------------------------------

    def _open_stream(self, proc: Procedure, call: Call, args: tuple[Any, ...]) -> None:
        vol, offset, length, flags = args
        if proc.stream == "upload":
            upload = self.host.hyp.upload_begin(vol, offset, length, flags)
            self.uploads[call.serial] = upload
            self.send(encode_reply(proc=call.proc, serial=call.serial, payload=b""))
            return
        data = self.host.hyp.download_range(vol, offset, length, flags)
        self.send(encode_reply(proc=call.proc, serial=call.serial, payload=b""))
        self.downloads.add(call.serial)
        for i in range(0, len(data), STREAM_CHUNK):
            piece = data[i:i + STREAM_CHUNK]
            self.send(stream_data_header(proc=call.proc, serial=call.serial, length=len(piece)) + piece)
        self.send(stream_data_header(proc=call.proc, serial=call.serial, length=0))

    def _stream_error(self, proc: int, serial: int, exc: LibvirtError) -> None:
        self.send(encode_packet(prog=REMOTE_PROGRAM, vers=REMOTE_PROTOCOL_VERSION, proc=proc,
                                type=MessageType.STREAM, serial=serial, status=MessageStatus.ERROR,
                                payload=encode_remote_error(remote_error(exc))))

    def _upload_data(self, msg: StreamData) -> None:
        if msg.serial not in self.uploads:
            return  # a stream we do not know (or finished): libvirtd drops it too
        upload = self.uploads[msg.serial]
        if upload is None:
            return  # after a failure everything sent is dropped, the finish included
        try:
            upload.write(msg.data)
        except LibvirtError as exc:
            self.uploads[msg.serial] = None
            self._stream_error(msg.proc, msg.serial, exc)

    def _stream_finished(self, serial: int, proc: int) -> None:
        if serial in self.uploads:
            upload = self.uploads.pop(serial)
            if upload is None:
                return
            upload.end()
            self.send(encode_stream_finish(proc=proc, serial=serial))
        elif serial in self.downloads:
            self.downloads.discard(serial)
            self.send(encode_stream_finish(proc=proc, serial=serial))

