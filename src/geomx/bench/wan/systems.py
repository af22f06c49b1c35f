"""The systems the wan section runs (``geomx bench --only wan``): DDP, PyTorch's local SGD, torchft's DiLoCo and
geomx's configurations, each a ``System`` row with its settings; the extra rows run only when named.

Usage::

    systems_for(job.MLP)                                   # the default rows, with the job's codec momentum
    systems_for(job.MLP, ["ddp", "geomx_fsa_64k"])          # just these, in this order
"""

from __future__ import annotations

from dataclasses import replace

from .job import Job
from .runs import System

H = 10  # the sync period of local SGD, DiLoCo and HFA (K1 * K2)
# DGC momentum correction asked for explicitly (the codec's default became 0 for Adam loops): the FSA row's
# local SGD has no momentum of its own, and the table was measured with the correction on
BSC = {"type": "bsc", "threshold": 0.01, "momentum": 0.9}
# a stateless WAN codec for collective HFA: 8 bits a value, one scale per 256
INT8 = {"type": "int8", "block": 256}

DDP = System("ddp", "DDP (gloo)", "ddp")
# dense HFA + outer in collective parties; its 64K-slice row below differs from it in the slice size only
COLLECTIVE_HFA = System("geomx_hfa_outer_collective", f"geomx HFA {H}x1 + outer, collective parties (wrapper)",
                        "geomx", period=H, hfa=(H, 1), outer=True, worker="wan_torch",
                        topology_extra={"links": {"lan": "collective"},
                                        "training": {"server_optimizer": "outer_nesterov"}})
SYSTEMS = (
    DDP,
    System("local_sgd", f"PostLocalSGD H={H}", "local_sgd", period=H),
    System("diloco", f"torchft DiLoCo H={H}", "diloco", period=H),
    System("geomx_fsa", "geomx FSA", "geomx"),
    System("geomx_fsa_p3", "geomx FSA + P3", "geomx", topology_extra={"training": {"p3": True}}),
    # HFA + outer at the same H both ways: K1=1 averages in the party every step (PostLocalSGD's subgroups),
    # K1=H only every H steps, with the global round (DiLoCo's four groups of one)
    # PostLocalSGD's schedule: the party's ranks agree every step, all ranks average their models every H steps
    System("geomx_hfa_h", f"geomx HFA 1x{H}", "geomx", period=H, hfa=(1, H)),
    System("geomx_hfa_outer", f"geomx HFA 1x{H} + outer", "geomx", period=H, hfa=(1, H), outer=True),
    System("geomx_hfa_outer_h", f"geomx HFA {H}x1 + outer", "geomx", period=H, hfa=(H, 1), outer=True),
    System("geomx_hfa_outer_h_p3", f"geomx HFA {H}x1 + outer + P3", "geomx", period=H, hfa=(H, 1), outer=True,
           topology_extra={"training": {"p3": True}}),
    System("geomx_bisparse", "geomx FSA + Bi-Sparse 1%", "geomx", compression=BSC),
    System("geomx_best", f"geomx best: HFA {H}x1 + outer + Bi-Sparse", "geomx", period=H, hfa=(H, 1), outer=True,
           compression=BSC),
)


# rows run only when named in ``--only``: what one of geomx's defaults saves, side by side with the default row
EXTRA_SYSTEMS = (
    System("geomx_fsa_no_early", "geomx FSA, no early answers", "geomx", topology_extra={"early_answers": False}),
    # HFA's global round answers a slice once the far party's slice is in: the answer trails the push by one
    # slice, so smaller slices overlap the two directions more (256K elements is the multi-party default)
    System("geomx_hfa_outer_h_64k", f"geomx HFA {H}x1 + outer, 64K slices", "geomx", period=H, hfa=(H, 1),
           outer=True, topology_extra={"slice_elems": 1 << 16}),
    System("geomx_fsa_64k", "geomx FSA, 64K slices", "geomx", topology_extra={"slice_elems": 1 << 16}),
    replace(COLLECTIVE_HFA, name="geomx_hfa_outer_collective_64k", label=f"{COLLECTIVE_HFA.label}, 64K slices",
            topology_extra={**COLLECTIVE_HFA.topology_extra, "slice_elems": 1 << 16}),
    # streaming outer sync against the same K1 x K2 without it: half the model goes global every K1 steps, and
    # the workers go on while it travels (the new global model, mixed half and half, one local round later)
    System("geomx_hfa_outer_5x2", "geomx HFA 5x2 + outer", "geomx", period=H, hfa=(5, 2), outer=True),
    System("geomx_hfa_outer_5x2_stream", "geomx HFA 5x2 + outer, streaming (2 fragments, overlap 1, mix 0.5)",
           "geomx", period=H, hfa=(5, 2), outer=True,
           topology_extra={"training": {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.5}}),
    # the same FSA job through the PyTorch wrapper: as its default puts it, the job's SGD on every worker (the
    # servers only sum, as in the kvstore loop of geomx_fsa and as in DDP), and translated onto the global server
    # (its answers are weights, so none goes out early)
    System("geomx_fsa_wrapper", "geomx FSA, PyTorch wrapper (optimizer on the workers)", "geomx", worker="wan_torch",
           topology_extra={"training": {"server_optimizer": "auto"}}),
    System("geomx_fsa_wrapper_translate", "geomx FSA, PyTorch wrapper, optimizer on the server", "geomx",
           worker="wan_torch", topology_extra={"training": {"server_optimizer": "translate"}}),
    # the wrapper in lan: collective parties: each party's two ranks a gloo group on its own host (no local server),
    # each rank syncing the slices it owns with the global server over its own connection
    System("geomx_fsa_collective", "geomx FSA, collective parties (wrapper)", "geomx", worker="wan_torch",
           topology_extra={"links": {"lan": "collective"}, "training": {"server_optimizer": "auto"}}),
    COLLECTIVE_HFA,
    # the same collective parties with a WAN codec: int8 (one scale per 256 values) both ways, a quarter of the
    # dense bytes; and Bi-Sparse 1% (each owner's deltas up with their residuals, the global model's changes down)
    System("geomx_hfa_outer_collective_int8", f"geomx HFA {H}x1 + outer + int8, collective parties (wrapper)",
           "geomx", period=H, hfa=(H, 1), outer=True, worker="wan_torch", compression=INT8,
           topology_extra={"links": {"lan": "collective"},
                           "training": {"server_optimizer": "outer_nesterov", "compression": INT8}}),
    System("geomx_hfa_outer_collective_bsc", f"geomx HFA {H}x1 + outer + Bi-Sparse 1%, collective parties (wrapper)",
           "geomx", period=H, hfa=(H, 1), outer=True, worker="wan_torch", compression=BSC,
           topology_extra={"links": {"lan": "collective"},
                           "training": {"server_optimizer": "outer_nesterov", "compression": BSC}}),
    # the same with its WAN rounds hidden: streaming in collective parties (each fragment global every 10 steps,
    # its round overlapping the next local round of 5 steps on every rank; the landing global model mixed half and
    # half with the party's, as geomx_hfa_outer_5x2_stream and torchft's diloco_stream mix), int8 both ways
    System("geomx_hfa_outer_collective_stream_int8", "geomx HFA 5x2 + outer, streaming (2 fragments, overlap 1, "
           "mix 0.5) + int8, collective parties (wrapper)", "geomx", period=H, hfa=(5, 2), outer=True,
           worker="wan_torch", compression=INT8, topology_extra={"links": {"lan": "collective"}, "training": {
               "server_optimizer": "outer_nesterov", "compression": INT8, "fragments": 2, "fragment_delay": 1,
               "fragment_alpha": 0.5}}),
    # torchft DiLoCo as torchtitan runs it: one replica group per data center (two ranks, FSDP2 over gloo inside,
    # a Manager per rank), the groups' Managers across the WAN; same inner and outer optimizers and H as diloco
    System("diloco_groups", f"torchft DiLoCo H={H}, 2 replica groups x 2 ranks (FSDP2)", "diloco", period=H,
           group_size=2),
    # torchft's own streaming DiLoCo at the same H: 2 fragments (modules), its longest overlap (H / 2 - 1 steps)
    System("diloco_stream", f"torchft streaming DiLoCo H={H} (2 fragments, overlap 4 steps, mix 0.5)", "diloco",
           period=H, worker_args=("--fragments", "2", "--fragment-sync-delay", "4", "--fragment-alpha", "0.5")),
)


def systems_for(spec: Job, only: list[str] | None = None) -> tuple[System, ...]:
    """The rows for ``spec`` (``only``: just these, in that order, extra rows included): Bi-Sparse's momentum
    correction is the job's (0 where Adam keeps its own); other codecs have none."""
    by_name = {s.name: s for s in (*SYSTEMS, *EXTRA_SYSTEMS)}
    chosen = [by_name[name] for name in dict.fromkeys(only)] if only else list(SYSTEMS)
    return tuple(replace(s, compression={**s.compression, "momentum": spec.codec_momentum})
                 if s.compression and s.compression.get("type") == BSC["type"] else s for s in chosen)
