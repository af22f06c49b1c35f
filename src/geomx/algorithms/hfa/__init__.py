"""HFA: hierarchical frequency aggregation (a local average every K1 steps, a global one every K2 local
rounds), with DiLoCo's outer optimizer and streaming fragments."""
