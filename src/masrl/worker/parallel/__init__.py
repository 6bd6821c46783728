"""Ranks: data parallel over a process group, and FSDP2 sharding."""
