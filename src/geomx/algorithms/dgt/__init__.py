"""DGT: differential gradient transmission; the least important slices of a push go over lossy UDP.

``datagrams`` (a push's blocks by importance, paced over channels of different reliability, rebuilt at a
deadline), ``feedback`` (the receiver's counts of what arrived, which the sender's adaptive K follows),
``server`` (DGT as a local server's route up to its global server)."""
