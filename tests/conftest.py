import os
import sys

import pytest

HERE = os.path.dirname(__file__)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

ROOT = os.path.dirname(HERE)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Llama with SmolLM2's tokenizer (seeded), loaded once."""
    from masrl.models import load_model

    return load_model("tiny-random", seed=0)


# the slow tier: whole runs through processes, clusters and every shipped config (minutes in all). `make test`
# runs everything; `make test-fast` (-m "not slow") leaves these out and takes a few minutes.
SLOW_FILES = {
    "test_fsdp_run.py", "test_fsdp.py", "test_ray_cluster_join.py", "test_ray_placement.py", "test_data_parallel.py",
    "test_gateway_examples.py", "test_kill_resume.py", "test_demo_script.py", "test_end_to_end.py",
    "test_shipped_configs.py", "test_fuzz.py", "test_async.py", "test_hostile_input.py", "test_bounded_inputs.py",
    "test_faults.py", "test_report.py", "test_compare.py", "test_time_limit.py", "test_keep_best.py",
    "test_reward_limits.py", "test_serve.py", "test_overlap.py", "test_verifiers.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if os.path.basename(str(item.fspath)) in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
