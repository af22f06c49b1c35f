"""TSEngine: pushes and answers relayed among members over an overlay, to spread the load off one link."""
