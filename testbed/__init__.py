"""The test bed: what stands in for the world around the operator, never shipped in its image.

`emulator/` is a Kubernetes API server emulator, `lab/` brings up real hypervisor hosts in network
namespaces. Tests, benchmarks and the demo use them; `egress-kvm run` never imports them, and the
Containerfile does not copy this folder (docs/architecture.md, "Where things live").
"""
