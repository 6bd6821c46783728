"""The run loop: the trainer (`loop`), the asynchronous loop, the task stream, dynamic sampling,
counterfactual credit, checkpoints and the best-by-validation checkpoint."""
