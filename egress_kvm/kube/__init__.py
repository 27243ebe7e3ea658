"""Kubernetes side: API access, list+watch, status, events, leader election."""
