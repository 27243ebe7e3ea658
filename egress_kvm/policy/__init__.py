"""What the operator will do on a tenant's behalf: egress decisions, Secret opt-in, safe error phrases."""
