"""Hierarchical frequency aggregation (HFA) at a local server.

Workers take K1 local optimizer steps, then push ``param / num_local_workers`` and pull (the script does
this, as in GeoMX's example). The local server sums the pushes: the party's average model. Every round it
answers with that average (a LAN-only model average), except every K2-th round, when the party's change
since the last global model goes up the WAN, weighted by the party's share of all workers::

    delta_p = (average_p - global_model) * n_p / N

The global server adds the weighted deltas to the global model (or feeds ``-sum(delta)`` to an outer
optimizer as a gradient), answers with the new global model, and the local server hands it to its workers.
Parties therefore count by their workers; a party of 4 weighs twice a party of 2. Unlike GeoMX, rounds are
counted per (key, slice), not by key 0 alone, and the global model every party starts from is the master
worker's, sent explicitly.

Streaming (Streaming DiLoCo's fragments): with ``fragments`` F > 1 the slices are split into F fragments of about
equal size, and fragment f goes global at the local rounds r with ``r % K2 == ((f + 1) * K2 // F) % K2``: each
slice still goes global once every K2 rounds, but the WAN carries 1/F of the model every K2/F rounds instead
of all of it at once. Every party computes the same split from the same slices (``assign_fragments``), over the
model's own: a key at or above ``WRAPPER_KEYS`` (the PyTorch wrapper's model signature, its step) takes no
fragment; should one go through a round, it goes global at the rounds a multiple of K2, as without streaming.

The streaming options (``fragments``, ``fragment_delay``, ``fragment_alpha``) are read and checked by
``streaming_options`` on every node alike: a local server's plug-in and a collective party's rank.

Usage (inside the local server)::

    hfa = LocalFrequencyAggregation(k2=10, party_weight=2 / 4)
    hfa.set_global_model(sid, initial_weights)
    delta = hfa.after_local_round(sid, average)     # None: answer the workers with `average`
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.options import parse_options
from ...core.strategy import WRAPPER_KEYS
from ...protocol.wire import SliceId

RUNS_PER_FRAGMENT = 4  # streaming: the model is cut into about this many runs of consecutive slices per fragment
STREAMING_OPTIONS: dict[str, type] = {"fragments": int, "fragment_delay": int, "fragment_alpha": float}


@dataclass(frozen=True)
class Streaming:
    """Streaming HFA's options: ``fragments`` F, the overlap ``delay`` tau (local rounds), the mix ``alpha``."""

    fragments: int = 1
    delay: int = 0
    alpha: float = 0.0

    @property
    def keeps_own_part(self) -> bool:
        """Whether a party keeps a part of its own model past a global round (fragments, an overlap, a mix): then
        no step has every party holding the global model."""
        return self.fragments > 1 or bool(self.delay) or bool(self.alpha)


def streaming_options(options: Mapping[str, Any], k2: int | None = None) -> Streaming:
    """The streaming options of ``options`` (parsed from text where they are text), checked: their ranges, and with
    the job's ``k2`` known, fragments <= K2 and delay < K2 (a slice's overlap ends before it goes global again;
    other fragments may go global meanwhile: each slice keeps its own overlap, unlike torchft's one counter, which
    needs delay < K2 / fragments). ValueError (OptionError for text that is no number) names what is wrong, with
    the same words on every node."""
    texts = {name: value for name, value in options.items() if name in STREAMING_OPTIONS and isinstance(value, str)}
    given = {**options, **parse_options("the hfa aggregation", STREAMING_OPTIONS, texts)}
    fragments, delay = int(given.get("fragments", 1)), int(given.get("fragment_delay", 0))
    alpha = float(given.get("fragment_alpha", 0.0))
    if fragments < 1:
        raise ValueError(f"fragments must be at least 1, got {fragments}")
    if delay < 0:
        raise ValueError(f"fragment_delay must be at least 0, got {delay}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"fragment_alpha must be between 0 and 1, got {alpha}")
    if k2 is not None and fragments > k2:
        raise ValueError(f"fragments ({fragments}) must not exceed HFA's K2 ({k2}): each fragment goes global at its "
                         "own round of the K2")
    if k2 is not None and delay >= k2:
        raise ValueError(f"fragment_delay ({delay}) must be below HFA's K2 ({k2}): a slice's overlap ends before it "
                         "goes global again")
    return Streaming(fragments, delay, alpha)


class LocalFrequencyAggregation:
    """The local server's side of HFA: which rounds go global, and what they send."""

    def __init__(self, k2: int, party_weight: float, fragments: int = 1) -> None:
        if k2 < 1:
            raise ValueError(f"HFA K2 must be at least 1, got {k2}")
        if not 0 < party_weight <= 1:
            raise ValueError(f"a party's weight is its share of all workers, got {party_weight}")
        if not 1 <= fragments <= k2:
            raise ValueError(f"streaming HFA needs 1 <= fragments <= K2 (each fragment its own round of the K2), "
                             f"got fragments={fragments} with K2={k2}")
        self.k2 = k2
        self.party_weight = party_weight
        self.fragments = fragments
        self._rounds: dict[SliceId, int] = {}
        self._global_model: dict[SliceId, np.ndarray] = {}
        self._fragment: dict[SliceId, int] = {}  # the split (empty until assign_fragments)

    @property
    def needs_fragments(self) -> bool:
        """Streaming, and no split yet: call ``assign_fragments`` with every slice before the first round."""
        return self.fragments > 1 and not self._fragment

    def assign_fragments(self, sizes: Mapping[SliceId, int]) -> None:
        """Split the slices (``sizes``: elements of each) into ``fragments`` fragments of about equal size. The
        slices, in (key, index) order (the model's layers in order), are cut into runs of consecutive slices of
        at most ``total / (RUNS_PER_FRAGMENT * fragments)`` elements (a larger slice is a run alone); then the
        runs go largest first, each to the smallest fragment so far (ties: the lower one; equal sizes: the earlier
        run). Equal runs are dealt in turn, so a fragment spans the model's depth (Streaming DiLoCo's strided
        pattern), and a run is long enough that a collective party, which deals its slices to its ranks in turn,
        gives every rank an even part of every fragment (fragments dealt slice by slice gave each to one rank:
        one WAN stream of the party's several). A model of few large slices gets the slice-by-slice split.
        Only the model's slices are split: keys at or above ``WRAPPER_KEYS`` (the wrapper's signature, which a
        server party holds and a rank may not yet have declared) are left out, so a tiny model's fragment is
        never the signature alone. Deterministic, so every party and rank that holds the same model makes the
        same split."""
        sizes = {sid: size for sid, size in sizes.items() if sid[0] < WRAPPER_KEYS}
        limit = sum(sizes.values()) / (RUNS_PER_FRAGMENT * self.fragments)
        runs: list[list[SliceId]] = []
        totals: list[int] = []  # each run's elements
        for sid in sorted(sizes):
            if not runs or totals[-1] + sizes[sid] > limit:
                runs.append([])
                totals.append(0)
            runs[-1].append(sid)
            totals[-1] += sizes[sid]
        loads = [0] * self.fragments
        for size, run in sorted(zip(totals, runs, strict=True), key=lambda r: (-r[0], r[1][0])):
            fragment = min(range(self.fragments), key=lambda f: (loads[f], f))
            for sid in run:
                self._fragment[sid] = fragment
            loads[fragment] += size

    def fragment(self, sid: SliceId) -> int:
        """The fragment of ``sid``: the split's; a wrapper key's is the last (it goes global at the rounds a multiple
        of K2); a model slice the split did not see goes by its key."""
        if sid[0] >= WRAPPER_KEYS:
            return self.fragments - 1
        return self._fragment.get(sid, sid[0] % self.fragments)

    def goes_global(self, sid: SliceId, count: int) -> bool:
        """Whether local round ``count`` (from 1) of ``sid`` goes global."""
        return count % self.k2 == (self.fragment(sid) + 1) * self.k2 // self.fragments % self.k2

    def set_global_model(self, sid: SliceId, model: np.ndarray) -> None:
        """Record the latest global model of ``sid`` (after init and after every global round)."""
        self._global_model[sid] = model

    def global_model(self, sid: SliceId) -> np.ndarray | None:
        """The latest global model of ``sid`` (None before init)."""
        return self._global_model.get(sid)

    def after_local_round(self, sid: SliceId, average: np.ndarray | None,
                          out: np.ndarray | None = None) -> np.ndarray | None:
        """None for a local round; for a global one, the weighted delta to push to the global server (written
        into ``out`` when given: ``average`` itself, say, where the caller no longer needs it).
        ``average`` may be None on a round the caller knows is local (``goes_global``): it is only counted."""
        if not self.count_round(sid):
            return None
        if average is None:
            raise ValueError(f"key {sid[0]} slice {sid[1]} goes global at local round {self.rounds(sid)}: its "
                             "average is needed")
        return self.delta(sid, average, out)

    def count_round(self, sid: SliceId) -> bool:
        """Count a local round of ``sid``; whether it goes global (its delta then comes from ``delta``, which a
        caller may compute later, from a copy of the average, before the slice's global model changes)."""
        count = self._rounds[sid] = self._rounds.get(sid, 0) + 1
        return self.goes_global(sid, count)

    def delta(self, sid: SliceId, average: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The weighted delta of ``sid``'s global round, ``(average - global model) * party weight`` (into
        ``out`` when given)."""
        base = self._global_model.get(sid)
        if base is None:
            raise RuntimeError(f"HFA has no global model for key {sid[0]} slice {sid[1]}: was it initialized?")
        delta = np.subtract(average, base, dtype=np.float32, out=out)
        delta *= np.float32(self.party_weight)
        return delta

    def rounds(self, sid: SliceId) -> int:
        return self._rounds.get(sid, 0)
