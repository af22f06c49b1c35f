"""ESync: each worker gets a number of local steps so that fast and slow workers reach the sync together."""
