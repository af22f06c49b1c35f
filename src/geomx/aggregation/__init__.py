"""Aggregation plug-ins: what a tier does with a completed sum and what it answers (the plain sum is
``core.plugins.Aggregation``)."""
