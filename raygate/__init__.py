"""raygate: gang admission for Ray workloads on Kubernetes."""

__version__ = "0.1.0"
