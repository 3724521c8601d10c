"""The local control plane: Kubernetes binaries built from pinned Go modules, started on loopback."""
