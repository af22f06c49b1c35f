"""Sync-policy plug-ins: when a round of pushes is complete (one file each; ``registry`` names them)."""
