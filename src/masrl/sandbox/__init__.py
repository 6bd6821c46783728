"""The sandbox: model-written Python run in a subprocess with walls around it (``runner``: ``run_python`` and the
``Sandbox`` pool; ``isolation``: which walls this machine allows; ``cgroups``: how memory is bounded; ``zygote``: a
pre-started process per pool slot that forks each run; ``harness``: what runs inside the walls). Nothing here runs
generated code in the caller's process. Its users: the code verifier (``tools/code_tests.py``) and the run's
services, which check ``sandbox.require`` against ``check_isolation``. The public names are ``runner``'s."""

from masrl.sandbox.runner import *  # noqa: F403 (its __all__)
from masrl.sandbox.runner import __all__  # noqa: F401
