"""Controller: reconcile queue, reconciler (observe, plan with pure rules, act), health probes, orphan GC.

The module map and how a reconcile flows are in docs/architecture.md ("A reconcile: observe, plan,
act"); docs/crd.md is the user-facing side.
"""
