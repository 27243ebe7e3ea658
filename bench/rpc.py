"""Benchmark: rpc (this package) against libvirt-python (the C binding) on the same libvirtd, in one run.

Run on demand (not in CI), as root, with a lab host up or not (one is brought up and torn down):

    .venv/bin/python bench/rpc.py [--lab-dir /var/tmp/egress-kvm-lab/lab1] [--upload-mib 512]

Measures, each side in the same run and alternating rounds so machine noise hits both alike:
- sequential latency of small calls (connect_get_lib_version, domain_lookup_by_name, domain_get_xml_desc)
  over the unix socket and over SSH, with client CPU per call;
- throughput with 64 calls in flight on one connection vs libvirt-python's best threaded rate on one
  connection (1..32 threads), with client CPU per call;
- volume upload MB/s of a random file vs `virsh vol-upload` over the same SSH link and vs a raw SSH
  channel (OpenSSH `cat > /dev/null`).
libvirt-python is Debian's python3-libvirt, for /usr/bin/python3 only: it runs in a subprocess.
Prints a markdown table (docs/performance.md holds the last one).
"""

# ruff: noqa: ASYNC240 - a benchmark script: its setup and cleanup block on purpose, outside the timings
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
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


# -- our side -----------------------------------------------------------------------------------------


async def rpc_sequential(client: rpc.Client, dom: rpc.Domain, n: int) -> dict[str, tuple[float, float]]:
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


async def rpc_pipelined(client: rpc.Client, total: int) -> tuple[float, float]:
    per = total // IN_FLIGHT

    async def worker() -> None:
        for _ in range(per):
            await client.connect_get_lib_version()

    await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])  # warm
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return per * IN_FLIGHT / wall, cpu / (per * IN_FLIGHT)


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


async def rpc_upload(client: rpc.Client, vol: rpc.StorageVol, path: Path) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    await client.storage_vol_upload(vol, 0, path.stat().st_size, 0, file_chunks(path))
    return time.perf_counter() - t0, time.process_time() - c0


def keep(results: dict[str, tuple[float, float]], key: str, r: tuple[float, float]) -> None:
    """Best (shortest wall time) of the rounds."""
    results[key] = min(results.get(key, r), r)


def us(x: float) -> str:
    return f"{x * 1e6:.0f} us"


# -- main ---------------------------------------------------------------------------------------------


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab-dir", default=os.environ.get("EGRESS_LAB_DIR"))
    ap.add_argument("--lab-index", type=int, default=int(os.environ.get("EGRESS_LAB_INDEX", "1")))
    ap.add_argument(
        "--seq-unix", type=int, default=3000, help="sequential calls per kind over the unix socket"
    )
    ap.add_argument("--seq-ssh", type=int, default=1500, help="sequential calls per kind over SSH")
    ap.add_argument("--tput", type=int, default=12800, help="calls per throughput measurement")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best of each side counts")
    ap.add_argument("--upload-mib", type=int, default=512)
    ap.add_argument("--upload-rounds", type=int, default=2)
    args = ap.parse_args()

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
        client_keys=[info.ssh_key],
        known_hosts=info.known_hosts,
        socket_path=h.socket,
    )
    rows: list[tuple[str, str, str, str]] = []
    try:
        async with await rpc.connect_unix(sock) as setup:
            with contextlib.suppress(rpc.NotFoundError):
                old = await setup.domain_lookup_by_name(DOMAIN)
                await setup.domain_undefine(old)
            await setup.domain_define_xml(
                f"<domain type='qemu'><name>{DOMAIN}</name><memory unit='MiB'>32</memory>"
                "<os><type arch='x86_64'>hvm</type></os><devices/></domain>"
            )
            print(f"libvirtd {await setup.connect_get_lib_version()} on {h.name} ({h.ip})", file=sys.stderr)

        # ---- latency and throughput -------------------------------------------------------------
        best: dict[str, Any] = {}
        for rnd in range(args.rounds):
            for transport, n in (("unix", args.seq_unix), ("ssh", args.seq_ssh)):
                print(f"round {rnd + 1}: {transport} ...", file=sys.stderr)
                if transport == "unix":
                    client = await rpc.connect_unix(sock)
                else:
                    client = await rpc.connect_ssh(h.ip, **ssh_kw)
                async with client:
                    dom = await client.domain_lookup_by_name(DOMAIN)
                    seq = await rpc_sequential(client, dom, n)
                    tput = await rpc_pipelined(client, args.tput)
                lp = await asyncio.to_thread(
                    libvirt_python, unix_uri if transport == "unix" else ssh_uri, n, args.tput
                )
                for name in SMALL_CALLS:
                    key = (transport, name)
                    best[("rpc", *key)] = min(best.get(("rpc", *key), seq[name]), seq[name])
                    lpv = tuple(lp["seq"][name])
                    best[("lp", *key)] = min(best.get(("lp", *key), lpv), lpv)
                best[("rpc", transport, "tput")] = max(best.get(("rpc", transport, "tput"), tput), tput)
                lp_best = max(((*tuple(v), int(k)) for k, v in lp["threads"].items()), key=lambda v: v[0])
                best[("lp", transport, "tput")] = max(best.get(("lp", transport, "tput"), lp_best), lp_best)

        for transport in ("unix", "ssh"):
            for name in SMALL_CALLS:
                (rw, rc), (lw, lc) = best[("rpc", transport, name)], best[("lp", transport, name)]
                rows.append(
                    (
                        f"sequential `{name}`, {transport}",
                        f"{us(rw)} (CPU {us(rc)})",
                        f"{us(lw)} (CPU {us(lc)})",
                        f"{rw / lw:.2f}x latency, {rc / lc:.2f}x CPU (target latency <= 1.0x)",
                    )
                )
            (rr, rcpu), (lr, lcpu, lthreads) = (
                best[("rpc", transport, "tput")],
                best[("lp", transport, "tput")],
            )
            rows.append(
                (
                    f"throughput, one connection, {transport}",
                    f"{rr:,.0f} calls/s with {IN_FLIGHT} in flight (CPU {us(rcpu)}/call)",
                    f"{lr:,.0f} calls/s best, {lthreads} threads (CPU {us(lcpu)}/call)",
                    f"{rr / lr:.2f}x rate, {rcpu / lcpu:.2f}x CPU/call (target >= 2x rate)",
                )
            )

        # ---- upload -------------------------------------------------------------------------------
        if args.upload_mib:
            size = args.upload_mib << 20
            data_file = workdir / "upload.bin"
            with data_file.open("wb") as f:
                for _ in range(args.upload_mib):
                    f.write(os.urandom(1 << 20))
            mb = size / 1e6
            results: dict[str, tuple[float, float]] = {}
            async with await rpc.connect_unix(sock) as setup:
                pool = await setup.storage_pool_lookup_by_name(h.pool)
                with contextlib.suppress(rpc.NotFoundError):
                    await setup.storage_vol_delete(await setup.storage_vol_lookup_by_name(pool, VOLUME))
                vol = await setup.storage_vol_create_xml(
                    pool,
                    f"<volume><name>{VOLUME}</name><capacity unit='bytes'>{size}</capacity>"
                    "<target><format type='raw'/></target></volume>",
                )
            ciphers = {"chacha": "chacha20-poly1305@openssh.com", "aes": "aes128-gcm@openssh.com"}
            for rnd in range(args.upload_rounds):
                print(f"upload round {rnd + 1} ...", file=sys.stderr)
                for tag, cipher in ciphers.items():
                    async with await rpc.connect_ssh(h.ip, encryption_algs=[cipher], **ssh_kw) as c:
                        r = await rpc_upload(c, vol, data_file)
                    keep(results, f"rpc {tag}", r)
                    wrapper = ssh_wrapper(info, workdir, cipher=cipher)
                    uri = f"qemu+ssh://{h.user}@{h.ip}/system?keyfile={info.ssh_key}&command={wrapper}"
                    r = await asyncio.to_thread(
                        timed_child,
                        ["virsh", "-q", "-c", uri, "vol-upload", "--pool", h.pool, VOLUME, str(data_file)],
                    )
                    keep(results, f"virsh {tag}", r)
                    r = await asyncio.to_thread(
                        timed_child,
                        [str(wrapper), "-i", info.ssh_key, f"{h.user}@{h.ip}", "cat > /dev/null"],
                        stdin=data_file,
                    )
                    keep(results, f"raw {tag}", r)
                async with await rpc.connect_unix(sock) as c:
                    r = await rpc_upload(c, vol, data_file)
                keep(results, "rpc unix", r)
                r = await asyncio.to_thread(
                    timed_child,
                    ["virsh", "-q", "-c", unix_uri, "vol-upload", "--pool", h.pool, VOLUME, str(data_file)],
                )
                keep(results, "virsh unix", r)
            rate = {k: mb / v[0] for k, v in results.items()}
            cpu = {k: v[1] / mb * 1e3 for k, v in results.items()}  # ms of client CPU per MB
            for tag, cipher in ciphers.items():
                rows.append(
                    (
                        f"upload {args.upload_mib} MiB over SSH, {cipher}",
                        f"{rate['rpc ' + tag]:.0f} MB/s (CPU {cpu['rpc ' + tag]:.1f} ms/MB)",
                        f"virsh {rate['virsh ' + tag]:.0f} MB/s (CPU {cpu['virsh ' + tag]:.1f} ms/MB); "
                        f"raw ssh {rate['raw ' + tag]:.0f} MB/s (CPU {cpu['raw ' + tag]:.1f} ms/MB)",
                        f"{rate['rpc ' + tag] / rate['virsh ' + tag]:.2f}x virsh, "
                        f"{rate['rpc ' + tag] / rate['raw ' + tag]:.2f}x raw (target >= 1.0x virsh)",
                    )
                )
            rows.append(
                (
                    f"upload {args.upload_mib} MiB, unix socket",
                    f"{rate['rpc unix']:.0f} MB/s (CPU {cpu['rpc unix']:.1f} ms/MB)",
                    f"virsh {rate['virsh unix']:.0f} MB/s (CPU {cpu['virsh unix']:.1f} ms/MB)",
                    f"{rate['rpc unix'] / rate['virsh unix']:.2f}x virsh",
                )
            )
            async with await rpc.connect_unix(sock) as setup:
                await setup.storage_vol_delete(vol)
    finally:
        with contextlib.suppress(Exception):
            async with await rpc.connect_unix(sock) as setup:
                await setup.domain_undefine(await setup.domain_lookup_by_name(DOMAIN))
        for p in workdir.iterdir():
            p.unlink()
        workdir.rmdir()
        if owned:
            lab.down(owned)

    load = os.getloadavg()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\n{when}, {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"best of {args.rounds} alternating rounds ({args.upload_rounds} for uploads)\n")  # fmt: skip
    print("| measurement | rpc (this package) | libvirt-python / virsh / ssh | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    asyncio.run(main())
