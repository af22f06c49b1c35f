"""One folder per algorithm, each with its pure rules (``rules.py``), its server plug-in (``server.py``) and its
worker side (``worker.py``), as far as it has them; ``registry`` names them all for the composition roots and
the PyTorch wrapper, whose strategies it keys by ``modes`` (the plan's mode and the party's LAN tier).

| folder | what it is |
|---|---|
| ``fsa`` | fully synchronous rounds (``dist_sync``) |
| ``mixed_sync`` | synchronous inside a party, asynchronous across (``dist_async``) |
| ``ssp`` | bounded staleness (``dist_ssp``) |
| ``hfa`` | hierarchical frequency aggregation (local average every K1 steps, global every K2), streaming fragments |
| ``esync`` | ESync: steps assigned per worker so fast and slow workers reach a round together |
| ``tsengine`` | TSEngine: workers relay pushes and answers among themselves |
| ``dgt`` | DGT: differential gradient transmission (unimportant slices over lossy UDP) |
"""
