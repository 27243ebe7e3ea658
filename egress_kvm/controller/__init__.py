"""Controller: reconcile queue, reconciler, health probes, orphan GC."""
