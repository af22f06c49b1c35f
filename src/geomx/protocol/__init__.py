"""The wire protocol: ``wire`` (a message: a small header and raw tensor frames; bundles of them), ``compact`` (a
bundle part's header as bytes and varints), ``kinds`` (the
message kinds: the core's and the algorithms' numbers), ``bodies`` (typed bodies of
control messages), ``tensors`` (received frames as read-only torch tensors, without copies)."""
