"""Decoupled outer rounds (HFA, DiLoCo, streaming): a global server closes a slice's round once ``quorum`` parties
have contributed and a grace window has passed, instead of waiting for every party.

The options (the topology's ``training`` block or ``GEOMX_<NAME>``; with no ``quorum``, today's rounds):

- ``quorum`` Q: the parties whose on-time contributions close a round (1 <= Q <= parties);
- ``grace``: how long a round that has its quorum still waits for the others: seconds, or ``auto``: the largest of
  the last ``SPREAD_ROUNDS`` spreads within ``GRACE_AUTO_MAX_S`` (that bound before any spread is seen; 0 when
  every recent spread was beyond it: waiting the bound would not have caught those parties); a spread is the time
  from a round's Q-th arrival to its last, in a round every party made, or to the arrival of a push that came one
  round late (so the window grows again when parties just miss it). Once a slice has closed two rounds, auto never
  waits more than ``PERIOD_SHARE`` of the shortest of the last rounds' periods (from one round's quorum to the
  next's): a longer window would hold the answer past the local round where the quorum's parties must land it
  (with K2 = 2, half a period on) and make them wait for the late party after all;
- ``stale_rounds`` S: a contribution that arrives after its round closed (its party has missed ``late`` releases of
  the slice since its last answer) is folded into the open round if ``late <= S``, else dropped; either way it is
  answered at once with the current global model, so its party never waits for a round it missed.

The merge weighs each contribution by the tokens (samples) its party processed since its last one, reported in the
push's body (``geomx.protocol.bodies.PushBody``): ``sum_p delta_p * (t_p / sum t)``; a party's local server (or, in a
``lan: collective`` party, each slice's owning rank: its ranks are one client of the rounds) sends its unweighted
delta ``average - global model``. With every party on time and tokens proportional to workers, the
weights equal today's worker shares bit for bit (a correctly rounded division of equal ratios).

``QuorumRounds`` is the rule the round table asks (``geomx.core.rounds.RoundRule``): pure, it reads the time it is
given, so a unit test drives it with a fake clock.

Usage::

    rule = QuorumRounds(Decoupled(quorum=2, grace=0.5, stale_rounds=1))
    table = RoundTable(host, clients, policy, rule=rule)
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...config import ConfigError
from ...config.units import parse_duration
from ...core.options import parse_options
from ...core.rounds import Admission, Round

DECOUPLED_OPTIONS: dict[str, type] = {"quorum": int, "grace": str, "stale_rounds": int}
GRACE_AUTO_MAX_S = 5.0  # grace: auto waits at most this long past the quorum
SPREAD_ROUNDS = 8  # grace: auto follows the spreads of this many last full rounds
PERIOD_SHARE = 0.4  # grace: auto waits at most this share of the quorum's round period
HISTORY = 32  # rounds whose status the report keeps


@dataclass(frozen=True)
class Decoupled:
    """The decoupled rounds' options: ``quorum`` (0: off, every round waits for every party), ``grace`` in seconds
    (None: auto), ``stale_rounds``."""

    quorum: int = 0
    grace: float | None = None
    stale_rounds: int = 1

    @property
    def on(self) -> bool:
        return self.quorum > 0


def decoupled_options(options: Mapping[str, Any], parties: int | None = None) -> Decoupled:
    """The decoupled options of ``options`` (text parsed), checked: quorum between 1 and the job's ``parties``
    (when known), grace ``auto`` or seconds >= 0, stale_rounds >= 0; grace and stale_rounds only with a quorum.
    ValueError (OptionError for text that is no number) names the option, with the same words on every node."""
    texts = {name: value for name, value in options.items() if name in DECOUPLED_OPTIONS and isinstance(value, str)}
    given = {**options, **parse_options("the hfa aggregation", DECOUPLED_OPTIONS, texts)}
    if "quorum" not in given:
        extra = sorted(name for name in ("grace", "stale_rounds") if name in given)
        if extra:
            raise ValueError(f"{', '.join(extra)} {'applies' if len(extra) == 1 else 'apply'} to decoupled rounds "
                             "only: set quorum too")
        return Decoupled()
    quorum = int(given["quorum"])
    if quorum < 1:
        raise ValueError(f"quorum must be at least 1, got {quorum}")
    if parties is not None and quorum > parties:
        raise ValueError(f"quorum ({quorum}) must not exceed the job's parties ({parties})")
    stale = int(given.get("stale_rounds", 1))
    if stale < 0:
        raise ValueError(f"stale_rounds must be at least 0, got {stale}")
    return Decoupled(quorum, _grace(str(given.get("grace", "auto"))), stale)


def _grace(text: str) -> float | None:
    """``auto`` (None), or seconds: a number, or a duration as every other setting takes it (``500ms``)."""
    if text.strip().lower() == "auto":
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ConfigError:
            raise ValueError(f"grace must be auto or seconds (0.5, 500ms), got {text!r}") from None
    if not seconds >= 0:  # (NaN too)
        raise ValueError(f"grace must be auto or seconds >= 0, got {text!r}")
    return seconds


class QuorumRounds:
    """The round rule of decoupled outer rounds (see the module docstring), and the status of every round it
    closed, for the stats files and the status page."""

    def __init__(self, options: Decoupled) -> None:
        assert options.on, "QuorumRounds needs a quorum"
        self.options = options
        self.spreads: deque[float] = deque(maxlen=SPREAD_ROUNDS)
        self.periods: deque[float] = deque(maxlen=SPREAD_ROUNDS)  # a slice's quorum to its next round's quorum
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.in_quorum: Counter[str] = Counter()  # client -> rounds it was on time for
        self.missed: Counter[str] = Counter()  # client -> rounds closed without it
        self.lost: Counter[str] = Counter()  # a dead client -> rounds closed while its party was out of the job
        self.late: Counter[str] = Counter()  # client -> contributions folded into a later round
        self.dropped: Counter[str] = Counter()  # client -> contributions beyond stale_rounds, dropped
        self.by_grace = 0  # rounds closed by the quorum and the grace, not by every party
        self.quorum_times: dict[tuple[int, int], float] = {}  # (key, slice) -> when its last round had its quorum
        self.closed_rounds = 0

    def grace(self) -> float:
        """The grace window now: the option's seconds, or auto's (see the module docstring)."""
        if self.options.grace is not None:
            return self.options.grace
        bound = min(GRACE_AUTO_MAX_S, PERIOD_SHARE * min(self.periods)) if self.periods else GRACE_AUTO_MAX_S
        if not self.spreads:
            return bound
        return max((s for s in self.spreads if s <= bound), default=0.0)

    def admit(self, rnd: Round, client: str, now: float) -> Admission:
        """A push of ``client`` for ``rnd`` (open): on time, late (folded, answered now) or dropped."""
        late = rnd.number - rnd.seen.get(client, rnd.base)
        if late <= 0:
            return Admission.ON_TIME
        missed = self.quorum_times.get((rnd.key, rnd.slice))
        if late == 1 and missed is not None:  # it missed the last round by this much
            self.spreads.append(now - missed)
        if late > self.options.stale_rounds:
            self.dropped[client] += 1
            return Admission.DROPPED
        self.late[client] += 1
        return Admission.LATE

    def quorum_at(self, rnd: Round) -> float | None:
        """When ``rnd`` reached its quorum of on-time contributions (None: not yet)."""
        times = sorted(rnd.arrivals[c] for c in rnd.contributions if c in rnd.arrivals)
        return times[self.options.quorum - 1] if len(times) >= self.options.quorum else None

    def ready(self, rnd: Round, awaited: Collection[str], now: float) -> bool:
        """Every awaited party is in, or the quorum is and the grace window since has passed."""
        if set(awaited) <= rnd.contributions.keys():
            return True
        reached = self.quorum_at(rnd)
        return reached is not None and now - reached >= self.grace()

    def deadline(self, rnd: Round) -> float | None:
        """When ``rnd`` closes if nobody else comes (None: it has no quorum yet)."""
        reached = self.quorum_at(rnd)
        return None if reached is None else reached + self.grace()

    def closed(self, rnd: Round, awaited: Collection[str], display: Any = str, dead: Collection[str] = ()) -> None:
        """``rnd`` closes: its status joins the history; a full round's spread feeds grace: auto. ``dead``: the
        clients dropped as dead; one whose party has no client back (none by its name that is awaited, or that
        pushed and was not dropped: it may have left since) counts this round as ``lost``, apart from ``missing``
        (awaited, not in time)."""
        on_time = list(rnd.contributions)
        missing = sorted(set(awaited) - set(on_time))
        pushed = (c for c in (*self.in_quorum, *self.late, *self.dropped) if c not in dead)
        live = {display(c) for c in (*awaited, *on_time, *pushed)}
        lost = {display(c): c for c in sorted(dead) if display(c) not in live}  # one client per party
        self.closed_rounds += 1
        self.in_quorum.update(on_time)
        self.missed.update(missing)
        self.lost.update(lost.values())
        reached = self.quorum_at(rnd)
        if reached is not None:
            previous = self.quorum_times.get((rnd.key, rnd.slice))
            if previous is not None and reached > previous:
                self.periods.append(reached - previous)
            self.quorum_times[(rnd.key, rnd.slice)] = reached
        if missing:
            self.by_grace += 1
        elif reached is not None:
            self.spreads.append(max(rnd.arrivals[c] for c in on_time) - reached)
        self.history.append({"key": rnd.key, "slice": rnd.slice, "round": rnd.number,
                             "quorum": sorted(display(c) for c in on_time),
                             "missing": sorted(display(c) for c in missing), "lost": sorted(lost),
                             "folded": sorted(display(c) for c in rnd.folded_from)})

    def report(self, display: Any = str) -> dict[str, Any]:
        """What the stats file and the heartbeats carry: counts per party (by display name: a party restarted after
        its death is a new client of the same name, and its counts add to its first life's) and the last rounds."""
        counters = {"on_time": self.in_quorum, "missed": self.missed, "lost": self.lost, "late_folded": self.late,
                    "dropped": self.dropped}
        named: dict[str, Counter[str]] = {status: Counter() for status in counters}
        for status, counts in counters.items():
            for client, count in counts.items():
                named[status][display(client)] += count
        parties = sorted({name for counts in named.values() for name in counts})
        by_party = {name: {status: counts[name] for status, counts in named.items()} for name in parties}
        return {"by_party": by_party,
                "quorum": self.options.quorum, "grace_s": self.grace(), "stale_rounds": self.options.stale_rounds,
                "rounds": self.closed_rounds, "closed_by_grace": self.by_grace,
                **{status: dict(sorted(counts.items())) for status, counts in named.items()},
                "last_rounds": list(self.history)}
