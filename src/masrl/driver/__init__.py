"""The driver side: what runs in the process that drives training.

The loop, the controller and the workflow contexts, the batchers, reward allocation, task data,
loggers, metrics, run checkpoints, and the handles on hosts in other processes (Ray actors,
data-parallel groups). It talks to hosts of policies only through ``worker.interface.PolicyHost``
and holds no tensors; none of its modules imports torch at module level.
"""
