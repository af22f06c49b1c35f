"""The collective LAN tier: inside a party whose ``lan`` is ``collective``, the ranks are one torch.distributed group
(gloo on the CPU, NCCL on GPUs); across parties each rank syncs the slices it owns with the global servers.
``owners`` says which rank owns each slice, ``layout`` packs a model's tensors so that one reduce-scatter gives
every rank the party's sum of its own slices and one all-gather gives everyone the answers, ``group`` joins the
party's process group from torchrun's variables with the topology's timeouts. ``party_model`` is a rank's view of
the party's model (``PartyModel``; ``WholePartyModel`` where every rank holds the whole model; and DDP's buckets),
``sharded`` the same under FSDP2 (``ShardedPartyModel``), ``fsdp`` which part of each parameter a rank holds under
FSDP2, ``reshard`` moves elements between FSDP2's shards and the slices' owners, ``host`` keeps a CUDA rank's owned
chunk in pinned host memory (FSA's buckets), ``mirror`` moves owned slices between the model's device and the host
for the global rounds of HFA (in place on the CPU, staged, or pinned with a side stream on CUDA), ``overlap``
all-reduces the party's mean gradient by DDP bucket while backward runs, ``ddp`` settles which of a script's DDP and
geomx averages the party's gradients."""
