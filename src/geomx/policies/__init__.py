"""Pure algorithm rules without any server: HFA's local counting and deltas, ESync's step assignment."""
