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


# the slow tier (whole runs through processes, clusters and every shipped config: minutes in all) is marked in its
# own files (`pytestmark = pytest.mark.slow`); `make test` runs everything, `make test-fast` (-m "not slow") the rest.
