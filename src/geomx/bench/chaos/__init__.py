"""``geomx bench --only chaos``: what a slow or lost data center costs the others, and what a lost global tier costs
the job (issue 49's four scenarios).

Three parties (``lan: server``, one worker each, unless a scenario says otherwise), the quality section's character
transformer and batches (``geomx.bench.workers.chaos``), DiLoCo's rounds (HFA, K1 x K2 local steps, outer Nesterov
on the global servers), emulated device time per step so that the parties' speeds follow the scenario rather than
the machine's load. Scenarios, each a record:

* ``slow_party``: dc2's steps 3x slower. Three jobs side by side: ``decoupled`` (``training.quorum: 2``, grace
  ``auto``: a round closes with the two fast parties, dc2's deltas fold into a later one), ``synchronous`` (today's
  rounds: every party waits for dc2 at each global round) and ``alone`` (dc0 and dc1 without dc2). ``goodput``: the
  fast parties' steps per second in ``decoupled`` over ``alone``; ``goodput_synchronous``: the same for
  ``synchronous``. Goal (issue 49): goodput >= 0.85 (synchronous: about 1/3).
* ``party_lost``: each party launched on its own (``geomx launch --party``, as on its own host), decoupled rounds
  (quorum 2); every process of dc2 gets SIGKILL between two outer steps a quarter into the run, and dc2 is started
  again ``restart_after_s`` (10 s) after its launcher saw it die, going on from the step where it died for two
  outer steps. ``others_stalled_s``: the longest time dc0 or dc1 went without a step beyond its median step;
  ``rejoin_s``: from the restart to the end of the restarted party's first outer step (its first contribution);
  ``val_loss_ratio``: the job's final validation loss against the same job without the fault (dc0 and dc1 train
  the same steps in both). Goals: others stalled <= 10 s, rejoin <= 30 s, the loss within 2%.
* ``rank_lost``: dc2 a collective party (``lan: collective``) of two ranks under its own ``torchrun --max-restarts
  1`` (docs/collective.md's recipe), dc0 and dc1 launched each on its own; dc2's second rank SIGKILLs itself
  between two outer steps after the first global round, in torchrun's first attempt; torchrun's agent stops the
  other rank and starts both again, and they rejoin as the party (the current global model at INIT), going on from
  the step where the rank died to the end. Rounds decoupled, quorum 2 (``ChaosPlan.rank_lost_quorum``; None:
  synchronous, where the others wait for dc2 at the global round until its ranks are declared dead, the heartbeat
  timeout; the record's ``rounds`` says which): ``others_stalled_s`` measures what the others waited.
  ``rejoin_s``: from the kill to the end of the restarted ranks' first outer step; ``restart_s``: from the kill to
  their first step; ``val_loss_ratio`` against the same job without the fault (dc2's ranks started by ``geomx
  launch``). Goals as party_lost's.
* ``global_restart``: the global tier killed: dc0's master worker SIGKILLs the global scheduler and the global server
  three quarters of a checkpoint interval after a checkpoint (``checkpoint: {dir, every_steps}``, every
  ``checkpoint_rounds`` global rounds), each party launched on its own, synchronous rounds; the job ends everywhere
  (dc0's launcher stops its party, dc1 and dc2 stop when the global scheduler has been silent for the heartbeat
  timeout), and is launched again with ``--resume``: every worker goes on from ``opt.start_step``. ``steps_lost``:
  the steps trained before the kill beyond the checkpoint the resumed job starts from, against the checkpoint
  interval in steps (goal: no more); ``all_gone_s``: the kill to every process gone; ``resume_s``: the kill to the
  resumed job's first step; ``val_loss_ratio`` against the job without the fault (goal: within 2%).

Under decoupled rounds the slow party trains ``steps / slowdown`` steps, so that it ends about when the others do
(a party that trained on alone after the others left would have no quorum to close its rounds); its deltas arrive
up to ``slowdown`` rounds late, so ``stale_rounds`` is the slowdown rounded up: they are folded in, not dropped.
Under synchronous rounds it trains as many steps as the others: every global round waits for it (with fewer, the
others would run free once it left).

The modules: ``plan`` (``ChaosPlan``, the topologies, the worker's arguments, one job, the records' arithmetic),
``slow`` (slow_party), ``lost`` (party_lost, rank_lost), ``restart`` (global_restart), ``report`` (the table),
``section`` (the scenarios by name, ``measure``, ``run``), ``__main__`` (``python -m geomx.bench.chaos``).

Usage::

    geomx bench --only chaos --quick
    python -m geomx.bench.chaos rank_lost global_restart --quick   # bench-results/chaos.json and the table
    record = slow_party(ChaosPlan(steps=40), Path("out"))
"""

from .lost import party_lost, rank_lost, rank_lost_topology
from .plan import (
    FULL,
    PARTIES,
    QUICK,
    SLOW,
    ChaosPlan,
    first_outer_at,
    longest_stall_s,
    read_ranks,
    steps_per_s,
    topology,
    worker_args,
)
from .report import lines
from .restart import global_restart, kill_step, restart_topology
from .section import SCENARIOS, measure, run
from .slow import slow_party

__all__ = ["FULL", "PARTIES", "QUICK", "SCENARIOS", "SLOW", "ChaosPlan", "first_outer_at", "global_restart",
           "kill_step", "lines", "longest_stall_s", "measure", "party_lost", "rank_lost", "rank_lost_topology",
           "read_ranks", "restart_topology", "run", "slow_party", "steps_per_s", "topology", "worker_args"]
