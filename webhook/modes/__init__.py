"""What each mode adds to a held object, one module per mode (as KubeRay's batch schedulers are)."""
