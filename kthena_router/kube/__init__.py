"""Kubernetes mode: the router follows the cluster (list+watch of Kthena's CRDs, the Secrets
they name and the Pods), builds the same typed config as file mode, and (one replica, holding
a Lease) writes status."""
