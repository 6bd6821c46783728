"""Runtime: workers that own weights, the controller that drives steps, and the training loop."""
