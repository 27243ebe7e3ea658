"""The lab's HTTP servers, run inside a host's network namespace on its bridge address.

Two uses: the target that health probes and tests fetch THROUGH a proxy VM (every host serves one on
its own bridge, :8080, because the root namespace does not forward between hosts), and the test image,
served from host0 (:8081) so the operator's image cache downloads it over real HTTP. Plain
`python -m http.server`, started detached (setsid -f) so it outlives `lab up`; it writes its own PID.
"""

from __future__ import annotations

import shlex
import socket
import sys
from pathlib import Path

from testbed.lab.layout import TARGET_PORT, HostLayout
from testbed.lab.procs import alive, read_pid, run, wait_for

TARGET_FILE = "hello.txt"
IMAGE_SERVER = "http-image"  # the name of host0's image server (its pidfile), testbed/lab/image.py


def target_body(*, index: int, host: str) -> str:
    return f"hello-through-proxy from egress-kvm lab{index} {host}\n"


def target_url(host: HostLayout) -> str:
    return f"http://{host.gateway}:{TARGET_PORT}/{TARGET_FILE}"


def _listening(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def serve(host: HostLayout, *, name: str, directory: Path, port: int) -> int:
    """Start a static file server for `directory` on host's bridge:port; return its PID once it listens."""
    pidfile = host.pidfile(name)
    pidfile.unlink(missing_ok=True)
    q = shlex.quote
    script = (f"echo $$ > {q(str(pidfile))}; exec {q(sys.executable)} -m http.server --bind {host.gateway} "
              f"--directory {q(str(directory))} {port} > {q(str(host.dir / (name + '.log')))} 2>&1")
    run(["ip", "netns", "exec", host.netns, "setsid", "-f", "sh", "-c", script])
    wait_for(lambda: alive(read_pid(pidfile)), timeout=10, what=f"{host.name}: {name} server pid")
    wait_for(lambda: _listening(host.gateway, port), timeout=15, what=f"{host.name}: {name} on :{port}")
    pid = read_pid(pidfile)
    assert pid is not None
    return pid


def serve_target(host: HostLayout, *, index: int) -> int:
    host.www.mkdir(parents=True, exist_ok=True)
    (host.www / TARGET_FILE).write_text(target_body(index=index, host=host.name))
    return serve(host, name="http-target", directory=host.www, port=TARGET_PORT)
