"""A simulated libvirt hypervisor host (docs/lab.md, "Simulated hosts")."""
