"""Benchmark: rpc (this package) against libvirt-python (the C binding), virsh and raw channels, in one run.

Run on demand (not in CI), as root, with a lab host up or not (one is brought up and torn down):

    .venv/bin/python bench/rpc.py [--lab-dir /var/tmp/egress-kvm-lab/lab1] [--rounds 3] [--upload-mib 256]

Measures, every side in the same run and in alternating rounds so machine noise hits all alike:
- floors: 20,000 sequential `connect_get_lib_version` on one unix socket with a blocking socket and with
  a minimal asyncio.Protocol ping-pong on the default loop and on uvloop, beside libvirt-python and rpc;
- sequential latency of small calls (connect_get_lib_version, domain_lookup_by_name, domain_get_xml_desc)
  over the unix socket and over SSH, with client CPU per call, rpc on uvloop and on the default loop;
- 64 calls in flight on one connection vs libvirt-python's best threaded rate on one connection;
- volume upload MB/s of a random file vs `virsh vol-upload` over the same SSH link, a raw asyncssh
  channel and a raw OpenSSH channel (`cat > /dev/null`) with the same cipher, and vs virsh over unix.
Each rpc/floor measurement runs in a fresh worker process (this file with --worker) on the loop it
names; libvirt-python is Debian's python3-libvirt, for /usr/bin/python3 only: it runs in a subprocess.
Prints markdown tables (docs/performance.md holds the last ones).
"""

# ruff: noqa: ASYNC240 - a benchmark script: its setup and cleanup block on purpose, outside the timings
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rpc
from testbed import lab
from testbed.lab.layout import LabLayout
from testbed.lab.procs import read_pid

DOMAIN = "rpcbench-dom"
VOLUME = "rpcbench-upload.raw"
SMALL_CALLS = ("connect_get_lib_version", "domain_lookup_by_name", "domain_get_xml_desc")
IN_FLIGHT = 64

LIBVIRT_PYTHON = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import libvirt
    TICK = os.sysconf("SC_CLK_TCK")
    def cpu():
        # this process plus its live children: over SSH the C binding's crypto runs in an `ssh` child
        total = time.process_time()
        for task in os.listdir("/proc/self/task"):
            try:
                kids = open(f"/proc/self/task/{task}/children").read().split()
            except OSError:  # a thread that just ended
                continue
            for child in kids:
                try:
                    fields = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                total += (int(fields[11]) + int(fields[12])) / TICK
        return total
    uri, domain, seq_n, tput_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    conn = libvirt.open(uri)
    dom = conn.lookupByName(domain)
    calls = {
        "connect_get_lib_version": conn.getLibVersion,
        "domain_lookup_by_name": lambda: conn.lookupByName(domain),
        "domain_get_xml_desc": lambda: dom.XMLDesc(0),
    }
    out = {"seq": {}, "threads": {}}
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        c0, t0 = cpu(), time.perf_counter()
        for _ in range(seq_n):
            fn()
        out["seq"][name] = [(time.perf_counter() - t0) / seq_n, (cpu() - c0) / seq_n]
    for threads in (1, 2, 4, 8, 16, 32):
        per = tput_n // threads
        def work():
            for _ in range(per):
                conn.getLibVersion()
        ts = [threading.Thread(target=work) for _ in range(threads)]
        c0, t0 = cpu(), time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall, used = time.perf_counter() - t0, cpu() - c0
        out["threads"][threads] = [per * threads / wall, used / (per * threads)]
    conn.close()
    print(json.dumps(out))
    """
)


# -- our side and the floors: each runs in a fresh worker process on the loop it is asked for ----------


def _start_loop(loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _connect(spec: dict[str, Any], **extra: Any) -> rpc.Client:
    if spec["transport"] == "unix":
        return await rpc.connect_unix(spec["sock"], **extra)
    return await rpc.connect_ssh(spec["ip"], **spec["ssh_kw"], **extra)


async def rpc_sequential(spec: dict[str, Any]) -> dict[str, Any]:
    n = spec["n"]
    async with await _connect(spec) as client:
        dom = await client.domain_lookup_by_name(DOMAIN)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "connect_get_lib_version": client.connect_get_lib_version,
            "domain_lookup_by_name": lambda: client.domain_lookup_by_name(DOMAIN),
            "domain_get_xml_desc": lambda: client.domain_get_xml_desc(dom),
        }
        out = {}
        for name, fn in calls.items():
            for _ in range(50):
                await fn()
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                await fn()
            out[name] = ((time.perf_counter() - t0) / n, (time.process_time() - c0) / n)
    return out


async def rpc_pipelined(spec: dict[str, Any]) -> tuple[float, float]:
    per = spec["n"] // IN_FLIGHT
    async with await _connect(spec) as client:

        async def worker() -> None:
            for _ in range(per):
                await client.connect_get_lib_version()

        await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])  # warm
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return per * IN_FLIGHT / wall, cpu / (per * IN_FLIGHT)


def _open_packet() -> bytes:
    from rpc.messages import encode_call
    from rpc.procedures import BY_NUMBER

    return encode_call(proc=1, serial=1, payload=BY_NUMBER[1].encode_args(("qemu:///system", 0)))


_CALL = struct.Struct(">IIIiiII")


def _lib_version_call(serial: int) -> bytes:
    return _CALL.pack(28, 0x20008086, 1, 157, 0, serial, 0)


def floor_blocking(spec: dict[str, Any]) -> tuple[float, float]:
    """The least a Python client can do per call: a blocking socket, send one packet, read one back."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(spec["sock"])

    def read_packet() -> bytes:
        head = s.recv(4, socket.MSG_WAITALL)
        (length,) = struct.unpack(">I", head)
        return s.recv(length - 4, socket.MSG_WAITALL)

    s.sendall(_open_packet())
    read_packet()
    n = spec["n"]
    for i in range(50):
        s.sendall(_lib_version_call(2 + i))
        read_packet()
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        s.sendall(_lib_version_call(100 + i))
        read_packet()
    wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
    s.close()
    return wall, cpu


class _PingPong(asyncio.Protocol):
    """A minimal asyncio.Protocol client: one future per call, completed when a whole packet is in."""

    def __init__(self) -> None:
        self.buf = b""
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= 4 and len(self.buf) >= int.from_bytes(self.buf[:4], "big"):
            packet, self.buf = self.buf, b""
            if self.waiter is not None:
                self.waiter.set_result(packet)

    async def call(self, data: bytes) -> bytes:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)  # type: ignore[attr-defined]
        return await self.waiter


async def floor_protocol(spec: dict[str, Any]) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_unix_connection(_PingPong, spec["sock"])
    await proto.call(_open_packet())
    n = spec["n"]
    for i in range(50):
        await proto.call(_lib_version_call(2 + i))
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        await proto.call(_lib_version_call(100 + i))
    wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
    transport.close()
    return wall, cpu


async def rpc_upload(spec: dict[str, Any]) -> tuple[float, float]:
    path = Path(spec["file"])
    extra = {"encryption_algs": [spec["cipher"]]} if spec.get("cipher") else {}
    async with await _connect(spec, **extra) as client:
        pool = await client.storage_pool_lookup_by_name(spec["pool"])
        vol = await client.storage_vol_lookup_by_name(pool, VOLUME)
        c0, t0 = time.process_time(), time.perf_counter()
        await client.storage_vol_upload(vol, 0, path.stat().st_size, 0, file_chunks(path))
        return time.perf_counter() - t0, time.process_time() - c0


async def asyncssh_raw(spec: dict[str, Any]) -> tuple[float, float]:
    """asyncssh's own ceiling for the same bytes and cipher: a session channel into `cat > /dev/null`."""
    path = Path(spec["file"])
    kw = dict(spec["ssh_kw"])
    kw.pop("socket_path")
    conn = await rpc.open_ssh(spec["ip"], encryption_algs=[spec["cipher"]], **kw)
    async with conn:
        c0, t0 = time.process_time(), time.perf_counter()
        async with conn.create_process("cat > /dev/null", encoding=None) as proc:
            async for chunk in file_chunks(path):
                proc.stdin.write(chunk)
                await proc.stdin.drain()
            proc.stdin.write_eof()
            await proc.wait()
        return time.perf_counter() - t0, time.process_time() - c0


WORKERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "seq": rpc_sequential,
    "tput": rpc_pipelined,
    "floor-blocking": floor_blocking,
    "floor-protocol": floor_protocol,
    "upload": rpc_upload,
    "asyncssh-raw": asyncssh_raw,
}


def worker_main(spec: dict[str, Any]) -> None:
    fn = WORKERS[spec["what"]]
    _start_loop(spec.get("loop", "asyncio"))
    result = asyncio.run(fn(spec)) if asyncio.iscoroutinefunction(fn) else fn(spec)
    print(json.dumps(result))


def run_worker(**spec: Any) -> Any:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker {spec['what']} on {spec.get('loop')} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def libvirt_python(uri: str, seq_n: int, tput_n: int) -> dict[str, Any]:
    out = subprocess.run(
        ["/usr/bin/python3", "-c", LIBVIRT_PYTHON, uri, DOMAIN, str(seq_n), str(tput_n)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"libvirt-python side failed:\n{out.stderr}")
    return json.loads(out.stdout)


# -- helpers ------------------------------------------------------------------------------------------


def ssh_wrapper(info: lab.LabInfo, workdir: Path, *, cipher: str | None = None) -> Path:
    """libvirt's ssh transport runs the `ssh` binary and ignores known_hosts=: give it the lab's file
    (and, for the like-for-like upload rows, a cipher)."""
    path = workdir / f"ssh-{cipher or 'default'}"
    extra = f"-c {cipher} " if cipher else ""
    path.write_text(
        "#!/bin/sh\n"
        f"exec ssh {extra}-o UserKnownHostsFile={info.known_hosts} -o StrictHostKeyChecking=yes "
        '-o BatchMode=yes "$@"\n'
    )
    path.chmod(0o755)
    return path


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed_child(argv: list[str], *, stdin: Path | None = None) -> tuple[float, float]:
    c0, t0 = child_cpu(), time.perf_counter()
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(stdin.open("rb")) if stdin else None
        subprocess.run(argv, stdin=f, check=True, capture_output=True, timeout=900)
    return time.perf_counter() - t0, child_cpu() - c0


async def file_chunks(path: Path, size: int = 8 << 20):  # type: ignore[no-untyped-def]
    with path.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def us(x: float) -> str:
    return f"{x * 1e6:.0f} us"


def span(values: list[tuple[float, ...]], *, best_is_max: bool = False) -> tuple[tuple[float, ...], str]:
    """The best sample (least wall time, or most rate) and the spread of the first field over rounds."""
    pick = max if best_is_max else min
    best = pick(values, key=lambda v: v[0])
    lo, hi = min(v[0] for v in values), max(v[0] for v in values)
    return best, f"{(hi - lo) / best[0] * 100:.0f}%"


def lat(values: list[tuple[float, ...]]) -> tuple[float, float, str]:
    (wall, cpu, *_), spread = span(values)
    return wall, cpu, f"{us(wall)} (CPU {us(cpu)}; spread {spread})"


# -- main ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--lab-dir", default=os.environ.get("EGRESS_LAB_DIR"))
    ap.add_argument("--lab-index", type=int, default=int(os.environ.get("EGRESS_LAB_INDEX", "1")))
    ap.add_argument(
        "--seq-unix", type=int, default=5000, help="sequential calls per kind over the unix socket"
    )
    ap.add_argument("--seq-ssh", type=int, default=2000, help="sequential calls per kind over SSH")
    ap.add_argument("--floor", type=int, default=20000, help="sequential calls per floor measurement")
    ap.add_argument("--tput", type=int, default=12800, help="calls per throughput measurement")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each side counts")
    ap.add_argument("--upload-mib", type=int, default=256)
    ap.add_argument("--upload-rounds", type=int, default=2)
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return

    owned = None
    if args.lab_dir and not lab.problems(args.lab_dir):
        info = lab.LabInfo.load(args.lab_dir)
    else:
        owned = args.lab_dir or f"/var/tmp/egress-kvm-lab/lab{args.lab_index}"
        info = lab.up(state_dir=owned, index=args.lab_index, hosts=1, image=False)
    h = info.hosts[0]
    layout = LabLayout.make(index=info.index, hosts=len(info.hosts), state_dir=info.state_dir)
    pid = read_pid(layout.host(0).pidfile("libvirtd"))
    sock = f"/proc/{pid}/root/run/libvirt/libvirt-sock"
    workdir = Path(tempfile.mkdtemp(prefix="rpcbench-", dir="/var/tmp"))
    # the same cipher on both sides for the small calls: rpc's default, AES-GCM
    ssh_bin = ssh_wrapper(info, workdir, cipher="aes128-gcm@openssh.com")
    ssh_uri = f"qemu+ssh://{h.user}@{h.ip}/system?keyfile={info.ssh_key}&command={ssh_bin}"
    unix_uri = f"qemu:///system?socket={sock}"
    ssh_kw: dict[str, Any] = dict(
        port=h.port,
        username=h.user,
        client_keys=[str(info.ssh_key)],
        known_hosts=str(info.known_hosts),
        socket_path=h.socket,
    )
    where = {"sock": sock, "ip": h.ip, "ssh_kw": ssh_kw, "pool": h.pool}
    loops = ("uvloop", "asyncio")
    rows: list[tuple[str, str, str, str]] = []
    floors: list[tuple[str, str]] = []
    samples: dict[tuple[str, ...], list[Any]] = {}

    def add(key: tuple[str, ...], value: Any) -> None:
        samples.setdefault(key, []).append(tuple(value))

    try:
        asyncio.run(_define_domain(sock))
        # ---- latency, throughput and the floors ---------------------------------------------------
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}: floors ...", file=sys.stderr)
            add(("floor", "blocking"), run_worker(what="floor-blocking", n=args.floor, **where))
            for loop in loops:
                add(("floor", loop), run_worker(what="floor-protocol", loop=loop, n=args.floor, **where))
            for transport, n in (("unix", args.seq_unix), ("ssh", args.seq_ssh)):
                print(f"round {rnd + 1}: {transport} ...", file=sys.stderr)
                for loop in loops:
                    seq = run_worker(what="seq", loop=loop, transport=transport, n=n, **where)
                    for name in SMALL_CALLS:
                        add(("rpc", loop, transport, name), seq[name])
                    tput = run_worker(what="tput", loop=loop, transport=transport, n=args.tput, **where)
                    add(("rpc", loop, transport, "tput"), tput)
                lp = libvirt_python(unix_uri if transport == "unix" else ssh_uri, n, args.tput)
                for name in SMALL_CALLS:
                    add(("lp", transport, name), lp["seq"][name])
                lp_best = max(((*tuple(v), int(k)) for k, v in lp["threads"].items()), key=lambda v: v[0])
                add(("lp", transport, "tput"), lp_best)

        fb = lat(samples[("floor", "blocking")])
        fa = lat(samples[("floor", "asyncio")])
        fu = lat(samples[("floor", "uvloop")])
        lpf = lat(samples[("lp", "unix", "connect_get_lib_version")])
        ru = lat(samples[("rpc", "uvloop", "unix", "connect_get_lib_version")])
        ra = lat(samples[("rpc", "asyncio", "unix", "connect_get_lib_version")])
        floors = [
            ("blocking socket, one packet out, one in", fb[2]),
            ("minimal asyncio.Protocol ping-pong, default loop", fa[2]),
            ("minimal asyncio.Protocol ping-pong, uvloop", fu[2]),
            ("libvirt-python (C binding)", lpf[2]),
            ("rpc (this package), uvloop", ru[2]),
            ("rpc (this package), default loop", ra[2]),
        ]
        for transport in ("unix", "ssh"):
            for name in SMALL_CALLS:
                uw, uc, utext = lat(samples[("rpc", "uvloop", transport, name)])
                aw, ac, atext = lat(samples[("rpc", "asyncio", transport, name)])
                lw, lc, ltext = lat(samples[("lp", transport, name)])
                ratio = f"uvloop {uw / lw:.2f}x latency, {uc / lc:.2f}x CPU (target <= 1.0x, <= 1.2x)"
                if transport == "unix" and name == "connect_get_lib_version":
                    ratio += f"; default loop {aw / fa[0]:.2f}x its Protocol floor (target <= 1.1x)"
                rows.append(
                    (
                        f"sequential `{name}`, {transport}",
                        f"uvloop {utext}; default loop {atext}",
                        ltext,
                        ratio,
                    )
                )
            (uw, uc), uspread = span(samples[("rpc", "uvloop", transport, "tput")], best_is_max=True)
            (aw, ac), aspread = span(samples[("rpc", "asyncio", transport, "tput")], best_is_max=True)
            (lr, lcpu, lthreads), lspread = span(samples[("lp", transport, "tput")], best_is_max=True)
            rows.append(
                (
                    f"{IN_FLIGHT} calls in flight, one connection, {transport}",
                    f"uvloop {uw:,.0f} calls/s (CPU {us(uc)}/call; spread {uspread}); "
                    f"default loop {aw:,.0f} calls/s (CPU {us(ac)}/call; spread {aspread})",
                    f"{lr:,.0f} calls/s best, {lthreads} threads (CPU {us(lcpu)}/call; spread {lspread})",
                    f"uvloop {uw / lr:.2f}x rate, {uc / lcpu:.2f}x CPU/call (target >= 1.0x, <= 0.7x)",
                )
            )

        # ---- upload -------------------------------------------------------------------------------
        if args.upload_mib:
            rows.extend(_uploads(args, info, h, sock, unix_uri, workdir, where))
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(_undefine_domain(sock))
        for p in workdir.iterdir():
            p.unlink()
        workdir.rmdir()
        if owned:
            lab.down(owned)

    load = os.getloadavg()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\n{when}, {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"best of {args.rounds} alternating rounds ({args.upload_rounds} for uploads); spread = "
          "(worst - best) / best of the wall time over the rounds\n")  # fmt: skip
    print(f"Floors: sequential `connect_get_lib_version` on one unix socket ({args.floor} calls per round)\n")
    print("| client | latency per call |")
    print("|---|---|")
    for row in floors:
        print("| " + " | ".join(row) + " |")
    print("\n| measurement | rpc (this package) | libvirt-python / virsh / ssh | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


async def _define_domain(sock: str) -> None:
    async with await rpc.connect_unix(sock) as setup:
        with contextlib.suppress(rpc.NotFoundError):
            old = await setup.domain_lookup_by_name(DOMAIN)
            await setup.domain_undefine(old)
        await setup.domain_define_xml(
            f"<domain type='qemu'><name>{DOMAIN}</name><memory unit='MiB'>32</memory>"
            "<os><type arch='x86_64'>hvm</type></os><devices/></domain>"
        )
        print(f"libvirtd {await setup.connect_get_lib_version()}", file=sys.stderr)


async def _undefine_domain(sock: str) -> None:
    async with await rpc.connect_unix(sock) as setup:
        await setup.domain_undefine(await setup.domain_lookup_by_name(DOMAIN))


async def _volume(sock: str, pool_name: str, size: int | None) -> None:
    """Create the upload volume (size given) or delete it (None)."""
    async with await rpc.connect_unix(sock) as setup:
        pool = await setup.storage_pool_lookup_by_name(pool_name)
        with contextlib.suppress(rpc.NotFoundError):
            await setup.storage_vol_delete(await setup.storage_vol_lookup_by_name(pool, VOLUME))
        if size is not None:
            await setup.storage_vol_create_xml(
                pool,
                f"<volume><name>{VOLUME}</name><capacity unit='bytes'>{size}</capacity>"
                "<target><format type='raw'/></target></volume>",
            )


def _uploads(
    args: argparse.Namespace,
    info: lab.LabInfo,
    h: lab.HostInfo,
    sock: str,
    unix_uri: str,
    workdir: Path,
    where: dict[str, Any],
) -> list[tuple[str, str, str, str]]:
    size = args.upload_mib << 20
    data_file = workdir / "upload.bin"
    with data_file.open("wb") as f:
        for _ in range(args.upload_mib):
            f.write(os.urandom(1 << 20))
    mb = size / 1e6
    results: dict[str, list[tuple[float, float]]] = {}

    def keep(key: str, r: Any) -> None:
        results.setdefault(key, []).append(tuple(r))

    asyncio.run(_volume(sock, h.pool, size))
    ciphers = {"chacha": "chacha20-poly1305@openssh.com", "aes": "aes128-gcm@openssh.com"}
    for rnd in range(args.upload_rounds):
        print(f"upload round {rnd + 1} ...", file=sys.stderr)
        for tag, cipher in ciphers.items():
            spec = dict(where, transport="ssh", cipher=cipher, file=str(data_file), loop="uvloop")
            keep(f"rpc {tag}", run_worker(what="upload", **spec))
            keep(f"asyncssh {tag}", run_worker(what="asyncssh-raw", **spec))
            wrapper = ssh_wrapper(info, workdir, cipher=cipher)
            uri = f"qemu+ssh://{h.user}@{h.ip}/system?keyfile={info.ssh_key}&command={wrapper}"
            keep(
                f"virsh {tag}",
                timed_child(
                    ["virsh", "-q", "-c", uri, "vol-upload", "--pool", h.pool, VOLUME, str(data_file)]
                ),
            )
            keep(
                f"openssh {tag}",
                timed_child(
                    [str(wrapper), "-i", str(info.ssh_key), f"{h.user}@{h.ip}", "cat > /dev/null"],
                    stdin=data_file,
                ),
            )
        spec = dict(where, transport="unix", file=str(data_file), loop="uvloop")
        keep("rpc unix", run_worker(what="upload", **spec))
        keep(
            "virsh unix",
            timed_child(
                ["virsh", "-q", "-c", unix_uri, "vol-upload", "--pool", h.pool, VOLUME, str(data_file)]
            ),
        )
    asyncio.run(_volume(sock, h.pool, None))
    best = {k: span(v) for k, v in results.items()}
    rate = {k: mb / b[0][0] for k, b in best.items()}
    cpu = {k: b[0][1] / mb * 1e3 for k, b in best.items()}  # ms of client CPU per MB

    def cell(k: str) -> str:
        return f"{rate[k]:.0f} MB/s (CPU {cpu[k]:.1f} ms/MB; spread {best[k][1]})"

    rows = []
    for tag, cipher in ciphers.items():
        r = rate["rpc " + tag]
        rows.append(
            (
                f"upload {args.upload_mib} MiB over SSH, {cipher}",
                "uvloop " + cell("rpc " + tag),
                f"virsh {cell('virsh ' + tag)}; raw asyncssh channel {cell('asyncssh ' + tag)}; "
                f"raw OpenSSH channel {cell('openssh ' + tag)}",
                f"{r / rate['virsh ' + tag]:.2f}x virsh (target >= 1.0x), {r / rate['asyncssh ' + tag]:.2f}x "
                f"raw asyncssh (target >= 0.9x), {r / rate['openssh ' + tag]:.2f}x raw OpenSSH",
            )
        )
    rows.append(
        (
            f"upload {args.upload_mib} MiB, unix socket",
            "uvloop " + cell("rpc unix"),
            "virsh " + cell("virsh unix"),
            f"{rate['rpc unix'] / rate['virsh unix']:.2f}x virsh (target >= 1.0x)",
        )
    )
    return rows


if __name__ == "__main__":
    main()
