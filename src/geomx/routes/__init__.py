"""Route plug-ins: how a value travels up and down between tiers (the direct route is ``core.plugins.Route``)."""
