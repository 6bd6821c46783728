"""A step or an evaluation with too many failed traces stops; GPU memory failures say what to lower."""

from types import SimpleNamespace

import pytest

from masrl.driver.observe.metrics import check_failures
from masrl.errors import MasrlError


def _traces(errors):
    return [SimpleNamespace(failed=e is not None, error=e) for e in errors]


def test_a_gpu_memory_failure_among_others_gets_the_settings_to_lower():
    errors = ["call to agent 'updater' failed in the engine: RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED "
              "when calling `cublasCreate(handle)`", None, "the retrieval backend went away", None]
    with pytest.raises(MasrlError) as info:
        check_failures({"traces": 4, "failed": 2}, _traces(errors), 0.25, "step 3", "the step's update ran on the rest")
    msg = str(info.value)
    assert "2 of 4 traces failed" in msg and "retrieval backend went away" in msg
    assert "GPU memory failures" in msg and "algorithm.micro_batch_tokens" in msg and "gpu_memory_utilization" in msg


def test_other_failures_get_no_memory_hint_and_few_failures_do_not_stop():
    errors = ["the retrieval backend went away", "timed out after 3s", None, None]
    with pytest.raises(MasrlError) as info:
        check_failures({"traces": 4, "failed": 2}, _traces(errors), 0.25, "step 3", "x")
    assert "GPU memory" not in str(info.value)
    check_failures({"traces": 4, "failed": 1}, _traces(errors[:1] + [None] * 3), 0.25, "step 3", "x")  # 1 of 4: no stop


def test_what_counts_as_running_out_of_gpu_memory():
    from masrl.worker.model.memory import memory_failure

    gib = 2**30
    cudnn = "RuntimeError: Expected mha_graph.execute(handle, variant_pack, workspace_ptr.get()).is_good() to be true"
    assert memory_failure("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert memory_failure("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert memory_failure(cudnn, free=2 * gib, total=140 * gib)  # the H200 with 2 GiB left: cuDNN's workspace
    assert not memory_failure(cudnn, free=60 * gib, total=140 * gib)  # room to spare: some other cuDNN failure
    assert not memory_failure(cudnn)  # nothing known of the device
    assert not memory_failure("shape '[4, 8]' is invalid for input of size 30", free=0, total=140 * gib)


def test_a_held_out_task_that_failed_scores_zero_and_its_reason_is_on_the_line():
    from masrl.driver.observe.metrics import eval_line, held_out_summary
    from masrl.trace import Trace

    traces = [Trace(f"t{i}", f"task{i}", 0) for i in range(4)]
    for t in traces[:2]:
        t.metrics["outcome"] = 1.0
    for t in traces[2:]:
        t.error = "the random player found no legal moves"
    got = held_out_summary(traces)
    assert got["failed"] == 2 and got["outcome"] == 0.5 and got["outcome_ran"] == 1.0
    line = eval_line(got)
    assert "accuracy 0.500" in line and "failed 2 (each counted as 0" in line and "no legal moves" in line
