"""A fleet of simulated hypervisors under the real operator, for bench/fleet.py and tests/e2e/test_fleet.py.

`stack.FleetStack` brings up N simulated hosts (testbed/sim behind real sshd, `lab.up(simulated=True)`),
the Kubernetes API emulator and the operator as separate processes, exactly as a user runs them;
`kube.FleetKube` applies and deletes Proxies over the API and watches them (when each became Ready, when
each was gone); `measure` reads what the operator, the emulator and the hosts count (libvirt RPCs by
method, API writes by writer, RSS and CPU from /proc); `invariants` decides, as a pure function of one
snapshot, whether the fleet converged and what leaked. See docs/performance.md ("Fleet").
"""
