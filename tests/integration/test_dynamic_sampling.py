"""Dynamic sampling: tasks whose groups all have equal rewards leave the update, fresh tasks refill."""

import asyncio

from helpers import is_flat_task
from tinycfg import prepared_trainer, tiny_config

from masrl.data.tasks import Task
from masrl.driver.run.stream import flat_tasks, fresh_tasks
from masrl.trace import Call, Trace


def _trace(task, sample, reward, failed=False):
    tr = Trace(trace_id=f"{task}{sample}", task_id=task, sample_idx=sample, error="x" if failed else None)
    tr.calls.append(Call(call_id=f"c{task}{sample}", trace_id=tr.trace_id, task_id=task, sample_idx=sample, agent="a",
                         policy="p", turn=0, messages=[], reward=reward))
    return tr


def test_a_task_is_flat_when_every_group_of_its_calls_has_equal_rewards():
    traces = [_trace("a", 0, 1.0), _trace("a", 1, 1.0), _trace("b", 0, 0.0), _trace("b", 1, 1.0),
              _trace("c", 0, 0.3), _trace("c", 1, 0.9, failed=True)]
    assert flat_tasks(traces, ["task_id", "agent", "turn"]) == {"a", "c"}  # c's other sample failed
    pool = [Task(f"t{i}", "q", "1") for i in range(10)]
    got = fresh_tasks(pool, {"t1", "t2"}, 3, seed=5)
    assert len(got) == 3 and not {"t1", "t2"} & {t.id for t in got} and got == fresh_tasks(pool, {"t1", "t2"}, 3, 5)


def test_flat_tasks_are_dropped_and_refilled_until_the_step_teaches(tmp_path):
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["rewards"] = [{"type": "helpers:half_flat_reward"}]
    data["rollout"].update(tasks_per_step=3, samples_per_task=2, dynamic_sampling=4)
    tr, workers, _ = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    ds = rec["dynamic_sampling"]
    tasks = sorted({t.task_id for t in tr.last_traces})
    flat = [t for t in tasks if is_flat_task(t)]
    assert ds["flat_tasks_dropped"] == len(flat) > 0 and ds["extra_tasks"] == len(tasks) - 3
    assert ds["teaching_tasks"] == len(tasks) - len(flat) == 3  # refilled to tasks_per_step
    assert rec["policies"]["solver"]["n_seqs"] == 3 * 2  # only the teaching tasks' calls trained
    assert rec["rollout"]["traces"] == 2 * len(tasks)


def test_without_dynamic_sampling_nothing_changes(tmp_path):
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["rewards"] = [{"type": "helpers:half_flat_reward"}]
    data["rollout"].update(tasks_per_step=3, samples_per_task=2)
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    assert "dynamic_sampling" not in rec and rec["policies"]["solver"]["n_seqs"] == 6
