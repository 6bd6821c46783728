"""What a run shows: loggers, metrics and summaries, collapse alarms."""
