"""Certificates: a CA and serving certificate for the webhook, stored in a Secret and rotated."""
