"""ESync: each worker gets a number of local steps so that fast and slow workers reach the sync together.

``rules`` (the state server's arithmetic: steps per worker from measured step times), ``kinds`` (the message kind
its speed reports travel under), ``bodies`` (a STATE request's and answer's JSON), ``server`` (the state rounds
in the servers), ``worker`` (the worker's half: report its step time, read its steps), ``strategy`` (the PyTorch
wrapper's side: HFA's average with assigned steps), ``collective`` (a ``lan: collective`` party as one worker)."""
