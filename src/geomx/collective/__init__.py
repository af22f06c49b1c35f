"""The collective LAN tier: inside a party whose ``lan`` is ``collective``, the ranks are one torch.distributed
group (gloo on the CPU, NCCL on GPUs); across parties each rank syncs the slices it owns with the global servers.

``owners`` says which rank owns each slice, ``layout`` packs a model's tensors so that one reduce-scatter gives
every rank the party's sum of its own slices and one all-gather gives everyone the answers, ``group`` joins the
party's process group from torchrun's variables with the topology's timeouts.
"""
