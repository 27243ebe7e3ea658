"""Controller: reconcile queue, reconciler, health probes, orphan GC.

Data flows one way: informer events -> `manager.Controller.on_event` -> `queue.WorkQueue` -> workers ->
`reconciler.Reconciler` (phase table in `plan`, spec in `proxyspec`, names in `naming`, desired instance
in `desired`, status shapes in `status`) -> provider; `health.Prober` probes on its own schedule and
enqueues on verdict changes; `gc.collect_orphans` runs periodically. docs/crd.md is the user-facing side.
"""
