"""Where hosts live: Ray actors and data-parallel ranks, as handles generated from the worker interface."""
