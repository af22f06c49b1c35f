"""Pluggable policies: sync algorithms (and later codecs and schedulers), each chosen by name."""
