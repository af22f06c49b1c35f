"""The cluster: who is in the job. ``membership`` (node ids, registration, address books), ``heartbeat``
(failure detection), ``scheduler`` (the local and global schedulers: registration, ranks, barriers)."""
