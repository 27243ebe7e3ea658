"""`egress-kvm` subcommands that drive the test bed (registered only where `testbed` is installed)."""
