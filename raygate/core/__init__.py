"""The pure core: raygate's vocabulary and rules, with no I/O, no Kubernetes client and no web server.

Everything above it (the Kubernetes client in raygate.kube, the components, the commands) may use
it; it uses nothing of theirs. The import contracts in pyproject.toml hold it to that.
"""
