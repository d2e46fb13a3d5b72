"""AsyncRunner's declared configuration (issue 28 item 5): CollectorConfig, ControlConfig, MetricsConfig.

The configs and the keyword arguments are two spellings of one setup: the same runner either way, a setting
passed both ways refused naming it, a bad value refused with the same message either way. ``ingest_workers``
(issue 30's parallel ingest) is checked here and carried to the pool's ``CollectorSetup``. Every runner is
``backend="inline"`` (no process) unless the test is about another backend's checks.
"""

import dataclasses
import pickle

import pytest

pytest.importorskip("stable_baselines3")
import _runner_envs
from _runner_common import ID, SMALL_ENV, assert_no_children, make_ppo, make_sac, release

import unilab_gym
import unilab_gym.sb3
from unilab_gym.runtime.inline_pool import InlineCollectorPool
from unilab_gym.sb3 import AsyncRunner, CollectorConfig, ControlConfig, MetricsConfig
from unilab_gym.sb3.config import DEFAULT, merge_settings

TWICE = "passed twice, as an argument of AsyncRunner and in"
INLINE = dict(env_id=ID, num_collectors=2, envs_per_collector=2, env_kwargs=SMALL_ENV, backend="inline")


@pytest.fixture
def sac():
    model = make_sac(learning_starts=10)
    yield model
    model.env.close()
    release(model)


def setup_of(runner):
    """What the runner handed its pool, without the model's objects (policy, writers)."""
    setup = runner._pool.setup
    return {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup) if f.name not in ("policy", "writers")}


def configs(runner):
    return runner.collector_config, runner.control_config, runner.metrics_config


# --------------------------------------------------------------------------- the faces
def test_the_configs_are_exported_from_the_wing_and_the_top_level():
    for name in ("CollectorConfig", "ControlConfig", "MetricsConfig"):
        assert name in unilab_gym.sb3.__all__
        assert getattr(unilab_gym, name) is getattr(unilab_gym.sb3, name)


def test_the_configs_are_frozen_and_default_to_the_runner_defaults():
    config = CollectorConfig(env_id=ID)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_collectors = 4
    assert (config.num_collectors, config.envs_per_collector, config.backend, config.start_method) == (
        2,
        32,
        "process",
        "spawn",
    )
    assert (config.max_collector_restarts, config.collector_timeout_s, config.ingest_workers) == (0, 60.0, 1)
    assert ControlConfig() == ControlConfig(control_port=None, control_addr="127.0.0.1", snapshot_dir=None)
    assert MetricsConfig() == MetricsConfig(metrics_port=None, metrics_addr="127.0.0.1")


def test_a_config_remembers_the_fields_it_was_given_also_through_pickle():
    config = CollectorConfig(ID, None, 4, seed=3)
    assert config.given() == {"env_id", "env_fn", "num_collectors", "seed"}
    assert CollectorConfig().given() == frozenset()
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config and copy.given() == config.given()
    assert CollectorConfig(num_collectors=2) == CollectorConfig()  # equality is the values', not what was given


def test_numpy_integers_are_stored_as_python_ints():
    np = pytest.importorskip("numpy")
    config = CollectorConfig(num_collectors=np.int64(3), seed=np.uint32(5))
    assert type(config.num_collectors) is int and type(config.seed) is int and config.seed == 5


# --------------------------------------------------------------------------- configs are the keywords
def test_configs_give_the_same_runner_as_the_keywords(sac, tmp_path):
    keywords = dict(
        **INLINE,
        seed=7,
        collector_timeout_s=12.5,
        snapshot_dir=str(tmp_path),
        snapshot_on_change=True,
        metrics_port=0,
    )
    with AsyncRunner(sac, **keywords) as by_keywords:
        expected = configs(by_keywords), setup_of(by_keywords), by_keywords.seed
        assert by_keywords.metrics_url is not None
        assert by_keywords.control.controller.snapshot_on_change is True
        assert str(by_keywords.control.controller.store.directory).startswith(str(tmp_path))
    collectors = CollectorConfig(**INLINE, seed=7, collector_timeout_s=12.5)
    control = ControlConfig(snapshot_dir=str(tmp_path), snapshot_on_change=True)
    with AsyncRunner(sac, collectors=collectors, control=control, metrics=MetricsConfig(metrics_port=0)) as by_configs:
        assert (configs(by_configs), setup_of(by_configs), by_configs.seed) == expected
        assert by_configs.collector_config == collectors and by_configs.control_config == control
        assert by_configs.metrics_url is not None
        assert by_configs.control.controller.snapshot_on_change is True
        assert str(by_configs.control.controller.store.directory).startswith(str(tmp_path))
    assert expected[1]["seed"] == 7 and expected[1]["collector_timeout_s"] == 12.5
    assert expected[1]["env_kwargs"] == SMALL_ENV and expected[1]["ingest_workers"] == 1


def test_keywords_and_configs_mix_when_each_setting_comes_one_way(sac):
    with AsyncRunner(sac, **INLINE) as by_keywords:
        expected = configs(by_keywords), setup_of(by_keywords)
    positional = (INLINE["env_id"], None, INLINE["num_collectors"])  # env_id, env_fn, num_collectors by position
    rest = CollectorConfig(envs_per_collector=2, env_kwargs=SMALL_ENV, backend="inline")
    with AsyncRunner(sac, *positional, collectors=rest) as mixed:
        assert (configs(mixed), setup_of(mixed)) == expected
        assert mixed.collector_config.given() == {
            "env_id",
            "env_fn",
            "num_collectors",
            "envs_per_collector",
            "env_kwargs",
            "backend",
        }


def test_an_on_policy_runner_from_configs_equals_one_from_keywords():
    model = make_ppo(4)
    with AsyncRunner(model, **INLINE) as by_keywords:
        expected = configs(by_keywords), setup_of(by_keywords)
    with AsyncRunner(model, collectors=CollectorConfig(**INLINE)) as by_config:
        assert (configs(by_config), setup_of(by_config)) == expected
        assert by_config.collector_config.env_kwargs == SMALL_ENV
    model.env.close()


def test_a_config_runner_trains(sac):
    with AsyncRunner(sac, collectors=CollectorConfig(**INLINE, seed=0)) as runner:
        runner.learn(64)
        assert sac.num_timesteps >= 64
    assert_no_children()


# --------------------------------------------------------------------------- a setting passed both ways
@pytest.mark.parametrize(
    "keywords, argument, config, name",
    [
        (dict(num_collectors=2), "collectors", CollectorConfig(**INLINE), "num_collectors"),
        (dict(num_collectors=4), "collectors", CollectorConfig(**INLINE), "num_collectors"),
        (dict(backend="inline"), "collectors", CollectorConfig(**INLINE), "backend"),
        (dict(seed=None), "collectors", CollectorConfig(**INLINE, seed=None), "seed"),  # None counts as passed
        (dict(control_port=0), "control", ControlConfig(control_port=0), "control_port"),
        (dict(snapshot_on_change=False), "control", ControlConfig(snapshot_on_change=True), "snapshot_on_change"),
        (dict(metrics_addr="127.0.0.1"), "metrics", MetricsConfig(metrics_addr="127.0.0.1"), "metrics_addr"),
    ],
)
def test_a_setting_passed_as_a_keyword_and_in_its_config_is_refused_naming_it(sac, keywords, argument, config, name):
    collectors = {} if argument == "collectors" else dict(collectors=CollectorConfig(**INLINE))
    with pytest.raises(ValueError, match=rf"^{name}: {TWICE} {argument}=") as info:
        AsyncRunner(sac, **{argument: config}, **collectors, **keywords)
    assert f"{name}={keywords[name]!r} and {type(config).__name__}({name}={getattr(config, name)!r})" in str(info.value)
    with AsyncRunner(sac, **{argument: config}, **collectors) as runner:  # the refusal left no claim on the model
        assert not runner.closed


def test_a_positional_env_id_and_the_configs_env_id_is_refused_and_every_setting_twice_is_named(sac):
    with pytest.raises(ValueError, match=rf"^env_id, envs_per_collector: {TWICE} collectors="):
        AsyncRunner(sac, ID, envs_per_collector=2, collectors=CollectorConfig(**INLINE))


def test_a_config_of_the_wrong_class_is_refused(sac):
    with pytest.raises(ValueError, match=r"^collectors must be a CollectorConfig or None, got ControlConfig\("):
        AsyncRunner(sac, **INLINE, collectors=ControlConfig())
    with pytest.raises(ValueError, match=r"^metrics must be a MetricsConfig or None, got \{'metrics_port': 0\}"):
        AsyncRunner(sac, **INLINE, metrics={"metrics_port": 0})


def test_merge_settings_leaves_a_config_without_keywords_as_it_is():
    config = ControlConfig(snapshot_on_change=True)
    assert merge_settings(ControlConfig, "control", config, dict(control_port=DEFAULT)) is config
    merged = merge_settings(ControlConfig, "control", config, dict(control_port=0))
    assert merged == ControlConfig(control_port=0, snapshot_on_change=True)
    assert merged.given() == {"control_port", "snapshot_on_change"}


# --------------------------------------------------------------------------- bad values: the same message either way
BAD = [
    (CollectorConfig, dict(num_collectors=0)),
    (CollectorConfig, dict(envs_per_collector=True)),
    (CollectorConfig, dict(max_collector_restarts=-1)),
    (CollectorConfig, dict(collector_timeout_s=0.0)),
    (CollectorConfig, dict(collector_timeout_s=float("nan"))),
    (CollectorConfig, dict(seed=-1)),
    (CollectorConfig, dict(env_kwargs="max_episode_steps=20")),
    (CollectorConfig, dict(start_method="bogus")),
    (CollectorConfig, dict(backend="threads")),
    (CollectorConfig, dict(ray_address="auto")),
    (CollectorConfig, dict(backend="ray", ray_address=6379)),
    (CollectorConfig, dict(backend="inline", max_collector_restarts=1)),
    (CollectorConfig, dict(ingest_workers=0)),
    (ControlConfig, dict(control_port=-1)),
    (ControlConfig, dict(control_port=70_000)),
    (ControlConfig, dict(control_addr="256.1.1.1")),
    (ControlConfig, dict(control_addr="")),
    (ControlConfig, dict(snapshot_on_change="yes")),
    (ControlConfig, dict(snapshot_dir=3)),
    (MetricsConfig, dict(metrics_port=70_000)),
    (MetricsConfig, dict(metrics_addr="256.1.1.1")),
]
ARGUMENT = {CollectorConfig: "collectors", ControlConfig: "control", MetricsConfig: "metrics"}


@pytest.mark.parametrize("kind, bad", BAD, ids=[f"{kind.__name__}-{next(iter(bad))}" for kind, bad in BAD])
def test_a_bad_value_has_the_same_message_in_a_config_as_by_keyword(sac, kind, bad):
    base = dict(env_id=ID, num_collectors=1, envs_per_collector=2)
    with pytest.raises(ValueError) as by_keyword:
        AsyncRunner(sac, **{**base, **bad})
    with pytest.raises(ValueError) as by_config:
        kind(**bad)
    assert str(by_config.value) == str(by_keyword.value)
    assert any(name in str(by_config.value) for name in bad)  # the message names the field
    with AsyncRunner(sac, **{**base, "backend": "inline"}) as runner:  # nothing was claimed
        assert not runner.closed


def test_the_runner_still_checks_what_needs_the_model_or_the_env(sac):
    with pytest.raises(ValueError, match="exactly one of env_id or env_fn"):
        AsyncRunner(sac, collectors=CollectorConfig(num_collectors=1, envs_per_collector=2, backend="inline"))
    with pytest.raises(ValueError, match="exactly one of env_id or env_fn"):
        AsyncRunner(sac, env_fn=_runner_envs.quadruped, collectors=CollectorConfig(**INLINE))
    with pytest.raises(ValueError, match=r"model's env has 1 envs|n_envs"):
        AsyncRunner(make_ppo(4), collectors=CollectorConfig(**{**INLINE, "num_collectors": 4}))


# --------------------------------------------------------------------------- ingest_workers
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_ingest_workers_must_be_an_int_of_at_least_one(sac, value):
    match = rf"^ingest_workers must be an int >= 1.*got {value!r}"
    with pytest.raises(ValueError, match=match):
        AsyncRunner(sac, **INLINE, ingest_workers=value)
    with pytest.raises(ValueError, match=match):
        CollectorConfig(backend="ray", ingest_workers=value)


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_more_than_one_ingest_worker_needs_the_ray_backend(sac, backend):
    match = rf"ingest_workers > 1 needs backend=\"ray\".*got ingest_workers=2 with backend='{backend}'"
    with pytest.raises(ValueError, match=match):
        AsyncRunner(sac, **{**INLINE, "backend": backend}, ingest_workers=2)
    with pytest.raises(ValueError, match=match):
        CollectorConfig(backend=backend, ingest_workers=2)
    assert CollectorConfig(backend="ray", ingest_workers=2).ingest_workers == 2
    assert_no_children()


def test_ingest_workers_is_carried_into_the_pools_setup(sac, monkeypatch):
    pytest.importorskip("ray")
    import unilab_gym.runtime.ray_pool as ray_pool

    class RecordingPool(InlineCollectorPool):  # stands in for the Ray pool: no Ray starts, the setup is kept
        def __init__(self, setup, ray_address, collector_resources):
            super().__init__(setup)
            self.ray_options = (ray_address, collector_resources)

    monkeypatch.setattr(ray_pool, "RayCollectorPool", RecordingPool)
    collectors = CollectorConfig(**{**INLINE, "backend": "ray"}, ingest_workers=3, collector_resources={"CPU": 1})
    with AsyncRunner(sac, collectors=collectors) as runner:
        assert isinstance(runner._pool, RecordingPool)
        assert runner._pool.setup.ingest_workers == 3
        assert runner._pool.ray_options == (None, {"CPU": 1})
    with AsyncRunner(sac, **{**INLINE, "backend": "ray"}, ingest_workers=2) as runner:
        assert runner._pool.setup.ingest_workers == 2
    with AsyncRunner(sac, **INLINE) as runner:
        assert runner._pool.setup.ingest_workers == 1
