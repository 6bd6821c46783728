"""The weights a worker holds: the model and its adapters, precision, copies, offload, checkpoint files, memory."""
