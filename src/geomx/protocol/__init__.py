"""The wire protocol: ``wire`` (a message: a small header and raw tensor frames), ``bodies`` (typed bodies of
control messages), ``tensors`` (received frames as read-only torch tensors, without copies)."""
