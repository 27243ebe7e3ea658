"""The operator process: flags, wiring of informer -> controller -> providers, leader election, the
health and metrics endpoints, providers-file polling and shutdown. Lifetimes only; no reconcile logic."""
