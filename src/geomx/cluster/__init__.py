"""The cluster: who is in the job and how it is doing. ``membership`` (node ids, registration, address books),
``addresses`` (the hosts and ports a job's members are told), ``ports`` (free ports held until handed on),
``heartbeat`` (failure detection, and each member's report), ``scheduler`` (the local and global schedulers:
registration, ranks, barriers), ``processes`` (a job's process tree, stopping on signals), ``status`` (the status
page's snapshot), ``digests`` (the parties' model digests compared), ``status_page`` (its HTML, JSON and
Prometheus metrics over HTTP)."""
