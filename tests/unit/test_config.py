import copy

import pytest
import yaml

from masrl.config import load_config
from masrl.driver.builder import group_hosts
from masrl.driver.checks import check_agents, check_policies, check_rewards
from masrl.errors import ConfigError
from masrl.families import build_workflow, config_path, shipped_configs

CONFIGS = list(shipped_configs().values())
BASE = {"policies": {"p": {}}, "agents": {"solver": {"policy": "p"}}, "workflow": {"name": "math_solver"}}


def test_there_are_shipped_configs():
    names = set(shipped_configs())
    assert {"math/team_shared", "math/team_two_policies", "math/team_four_policies", "math/team_lora", "math/solver"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_every_shipped_config_loads_and_builds(path):
    cfg = load_config(path)
    wf = build_workflow(cfg.workflow.name, cfg.workflow.options)
    agents = check_agents(cfg, wf)
    policies = check_policies(cfg)
    assert set(agents) == set(cfg.agents)
    assert {a.policy for a in agents.values()} == {p.name for p in policies}
    assert check_rewards(cfg)
    hosts = group_hosts(policies)
    if any(p.is_lora for p in policies):
        assert len(hosts) == 1  # all adapters on one base held once
    else:
        assert len(hosts) == len(policies)


def test_overrides_are_typed():
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["algorithm.kl_coef=0.05", "agents.solver.temperature=0.7",
                                                           "algorithm.group_key=[task_id, agent]", "train.steps=3"])
    assert cfg.algorithm.kl_coef == 0.05 and cfg.agents["solver"].temperature == 0.7
    assert cfg.algorithm.group_key == ["task_id", "agent"] and cfg.train.steps == 3


def err(overrides=(), data=None):
    with pytest.raises(ConfigError) as e:
        load_config(data=copy.deepcopy(data or BASE), overrides=list(overrides))
    return str(e.value)


def test_unknown_key_named_with_suggestion():
    msg = err(["algorithm.klcoef=0.1"])
    assert "unknown key `algorithm.klcoef`" in msg and "did you mean `kl_coef`" in msg
    assert "agents.solver.temprature" in err(["agents.solver.temprature=1"])
    assert "policies.p.lora.rank" in err(["policies.p.lora.rank=4"])


def test_wrong_type_named():
    msg = err(["train.steps=many"])
    assert "`train.steps`" in msg and "integer" in msg
    assert "`policies.p.optim.lr`" in err(["policies.p.optim.lr=-1"])


def test_agent_mapped_to_missing_policy():
    msg = err(["agents.solver.policy=ghost"])
    assert "agents.solver.policy: 'ghost' is not a policy" in msg and "p" in msg


def test_unused_policy_rejected():
    data = copy.deepcopy(BASE)
    data["policies"]["extra"] = {}
    assert "policies.extra is not used by any agent" in err(data=data)


def test_missing_dataset_file():
    msg = err(["data.train.source=file", "data.train.path=/no/such/file.jsonl"])
    assert "`data.train`" in msg and "/no/such/file.jsonl" in msg and "does not exist" in msg


def test_model_path_that_does_not_exist():
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["model=/no/such/model"])
    with pytest.raises(ConfigError, match=r"model: model '/no/such/model' does not exist"):
        check_policies(cfg)
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["policies.p.model=/nope"])
    with pytest.raises(ConfigError, match=r"policies.p.model: model '/nope'"):
        check_policies(cfg)


def test_agent_not_in_workflow_and_missing_agent():
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["agents.critic.policy=p"])
    with pytest.raises(ConfigError, match="agents.critic: workflow 'math_solver' has no agent 'critic'"):
        check_agents(cfg, build_workflow("math_solver", {}))
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["workflow.name=math_team"])
    with pytest.raises(ConfigError, match="needs agent"):
        check_agents(cfg, build_workflow("math_team", {}))


def test_bad_override_syntax_and_files(tmp_path):
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(data=copy.deepcopy(BASE), overrides=["train.steps"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_unknown_workflow_and_reward():
    with pytest.raises(ConfigError, match="workflow 'nope' is not registered"):
        build_workflow("nope", {})
    assert "unknown reward type 'shaping'" in err(["rewards=[{type: shaping}]"])
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["rewards=[{type: 'no_such_module:thing'}]"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        check_rewards(cfg)


def test_resolved_config_round_trips(tmp_path):
    from masrl.config import dump_config

    cfg = load_config(CONFIGS[0])
    again = load_config(data=yaml.safe_load(dump_config(cfg)))
    assert again == cfg


@pytest.mark.parametrize("key", ["offload_optimizer", "offload_reference", "offload_weights"])
def test_offload_switches_on_a_cpu_policy_are_refused_by_name(key):
    cfg = load_config(data=copy.deepcopy(BASE), overrides=[f"policies.p.{key}=true", "device=cpu", "algorithm.kl_coef=0.1"])
    with pytest.raises(ConfigError, match=f"policies.p.{key}: offloading moves state off a GPU"):
        check_policies(cfg)


@pytest.mark.parametrize(("overrides", "message"), [
    (["policies.p.shard_optimizer=true"], "policies.p.shard_optimizer: shards the optimizer state over data-parallel"),
    (["policies.p.shard_optimizer=true", "policies.p.data_parallel=2", "runtime.placement=ray", "device=cuda",
      "policies.p.offload_optimizer=true"], "shard_optimizer and offload_optimizer"),
    (["policies.p.data_parallel=2"], "policies.p.data_parallel: ranks run as Ray actors"),
    (["policies.p.fsdp=true"], "policies.p.fsdp: shards the policy over its data-parallel ranks; set policies.p.data_parallel"),
    (["policies.p.fsdp=true", "policies.p.data_parallel=2", "runtime.placement=ray", "policies.p.schedule={ema: 0.9}"],
     r"policies.p.fsdp: not with policies.p.schedule.ema yet"),
    (["policies.p.fsdp=true", "policies.p.data_parallel=2", "runtime.placement=ray", "policies.p.lora={r: 8}"],
     "policies.p.fsdp: not with policies.p.lora"),
])
def test_data_parallel_switches_are_refused_with_the_key_and_the_fix(overrides, message):
    cfg = load_config(data=copy.deepcopy(BASE), overrides=overrides)
    with pytest.raises(ConfigError, match=message):
        check_policies(cfg)


def test_a_typo_inside_a_nested_option_gets_a_close_match():
    """Options checked below the config's own models (a workflow's keyword options, a family's source options)
    name the key and suggest the right one, as the config's own keys do."""
    from masrl.families import build_workflow, check_source

    with pytest.raises(ConfigError, match=r"workflow.options.gmae: .* \(did you mean `game`\?\)"):
        build_workflow("textarena", {"gmae": "TicTacToe-v0"})
    from masrl.config import DataSourceConfig

    bad = DataSourceConfig(source="reasoning_gym", n=4, seed=1, options={"datasets": {"leg_counting": {"weigth": 1}}})
    with pytest.raises(ConfigError, match=r"data.train.options.datasets.leg_counting.weigth` \(did you mean `weight`"):
        check_source(bad, "data.train")


@pytest.mark.parametrize("source, ref, says", [
    ("def broken(:\n", "mod_syntax:R", "does not compile"),
    ("raise RuntimeError('boom at import')\n", "mod_raises:R", "importing module 'mod_raises' raised RuntimeError: boom"),
    ("def R(weight=1.0):\n    raise ValueError('bad factory')\n", "mod_factory:R", "building it raised ValueError: bad "
                                                                         "factory"),
    (None, ":R", "absolute module path"),
    (None, ".mod:R", "absolute module path"),
    (None, "mod_missing_attr:", "absolute module path"),
])
def test_a_plugin_that_cannot_be_loaded_is_a_config_error_naming_the_key(tmp_path, monkeypatch, source, ref, says):
    """A reward plugin whose module does not compile or raises at import, whose factory raises, or whose name is
    malformed: one config error naming the key and the module's own message, never a traceback."""
    from masrl.driver.checks import check_rewards

    if source is not None:
        (tmp_path / f"{ref.split(':')[0]}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(config_path("math/solver"), [f"rewards=[{{type: outcome}}, {{type: '{ref}'}}]"])
    with pytest.raises(ConfigError, match=says) as info:
        check_rewards(cfg)
    assert "rewards.1" in str(info.value)
