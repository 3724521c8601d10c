"""The Kubernetes API layer shared by every component: one client, informers, Events, the live config."""
