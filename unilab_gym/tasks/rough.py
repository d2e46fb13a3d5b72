"""``UniLab/QuadrupedRough-v0``'s task: velocity tracking on heightfield terrain with a terrain curriculum.

:class:`RoughTask` is :class:`~unilab_gym.tasks.quadruped.QuadrupedTask` (the same observation, reward terms and fall
conditions) on a terrain tile per env (:mod:`unilab_gym.tasks.terrain`: legged_gym's smooth and rough slopes, stairs
up and down, discrete obstacles), with three changes:

- heights are measured from the terrain: the ``base_height`` reward term and the ``height`` fall condition use the
  base's height above the terrain under it, and 187 height samples around the base (legged_gym's grid, in the base's
  yaw frame: :data:`~unilab_gym.tasks.terrain.HEIGHT_POINTS`) are in the critic observation, and in the policy
  observation with ``height_obs=True``;
- an episode is truncated when the base leaves its tile's core (it walked more than half the tile: the curriculum's
  "up");
- the terrain curriculum (legged_gym ``_update_terrain_curriculum``): at each new episode of an env, its level goes
  up if its last episode ended more than ``terrain_size / 2`` from the tile's centre, down if it ended closer than half
  the commanded distance (``|command_xy| * max_episode_steps * control_dt / 2``); the tile's difficulty is
  ``level / (terrain_levels - 1)``.

Each episode draws, from its episode's stream: the command (3 draws) and the initial pose (12 draws), as
:class:`QuadrupedTask`; then the terrain type (1 draw from ``terrain_proportions``) and a seed for the tile (1
draw), from which the tile is made. So an env's tiles come from its own episode seeds and levels only: env ``i`` is
the same whatever ``envs_per_cluster`` and whatever its neighbours do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from unilab_gym.sim.camera import Camera
from unilab_gym.sim.scene import Scene, TerrainEpisodes
from unilab_gym.tasks.quadruped import (
    CRITIC_OBS_DIM,
    CRITIC_OBS_LAYOUT,
    OBS_DIM,
    OBS_LAYOUT,
    QuadrupedConfig,
    QuadrupedTask,
    critic_observation,
)
from unilab_gym.tasks.terrain import (
    DEFAULT_PROPORTIONS,
    HEIGHT_POINTS,
    HORIZONTAL_SCALE,
    NUM_HEIGHT_POINTS,
    TERRAIN_TYPES,
    curriculum_step,
    make_tile,
    sample_heights,
    tile_cells,
)
from unilab_gym.validation import check_int, check_positive, check_positive_int, check_real

if TYPE_CHECKING:
    from unilab_gym.sim.world import RobotState

#: The (clipped) range in m of a height sample: the base's height above the terrain point.
HEIGHT_SAMPLE_RANGE = (-1.0, 1.0)


@dataclass(frozen=True)
class RoughConfig(QuadrupedConfig):
    """The task configuration of ``UniLab/QuadrupedRough-v0``.

    :class:`~unilab_gym.tasks.quadruped.QuadrupedConfig`'s fields and the terrain's.

    Raises:
        ValueError: an invalid value, naming the field and the value.
    """

    terrain_levels: int = 10
    """Number of difficulty levels, >= 1 (legged_gym ``num_rows`` 10); level ``l`` has difficulty
    ``l / (terrain_levels - 1)``."""
    init_terrain_level: int = 0
    """Every env's level at its first episode, in [0, terrain_levels)."""
    terrain_curriculum: bool = True
    """Move levels up and down between episodes (legged_gym ``curriculum``); ``False``: every episode at
    ``init_terrain_level``."""
    terrain_proportions: tuple[float, ...] = DEFAULT_PROPORTIONS
    """Probability of each of :data:`~unilab_gym.tasks.terrain.TERRAIN_TYPES` (5 values >= 0, summing to > 0;
    normalized)."""
    terrain_size: float = 8.0
    """Side in m of a tile's core, > 0 (legged_gym ``terrain_length`` 8 m); an episode is truncated when the base
    leaves it."""
    terrain_border: float = 1.0
    """Width in m of the flat ring around the core, >= 0.5 (the feet's support when the base reaches the edge; the
    physics layer pins its far corners, see :mod:`unilab_gym.sim.terrain`)."""
    height_obs: bool = False
    """Also give the policy the 187 height samples (columns ``height_samples`` of the observation); by default only
    the critic (``privileged_obs=True``) has them."""

    def __post_init__(self) -> None:
        """:class:`QuadrupedConfig`'s checks, then the terrain fields'."""
        super().__post_init__()
        levels = check_positive_int("terrain_levels", self.terrain_levels)
        proportions = self.terrain_proportions
        if (
            not isinstance(proportions, (Sequence, np.ndarray))
            or isinstance(proportions, (str, bytes))
            or len(proportions) != len(TERRAIN_TYPES)
        ):
            raise ValueError(
                f"terrain_proportions must be {len(TERRAIN_TYPES)} numbers >= 0 (for {list(TERRAIN_TYPES)}), "
                f"got {proportions!r}"
            )
        values = tuple(check_real("terrain_proportions", v, minimum=0.0) for v in proportions)
        if sum(values) <= 0.0:
            raise ValueError(f"terrain_proportions must not all be 0, got {proportions!r}")
        for name in ("terrain_curriculum", "height_obs"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        converted = {
            "terrain_levels": levels,
            "init_terrain_level": check_int(
                "init_terrain_level", self.init_terrain_level, minimum=0, maximum=levels - 1
            ),
            "terrain_curriculum": bool(self.terrain_curriculum),
            "terrain_proportions": values,
            "terrain_size": check_positive("terrain_size", self.terrain_size),
            "terrain_border": check_real("terrain_border", self.terrain_border, minimum=0.5),
            "height_obs": bool(self.height_obs),
        }
        for name, value in converted.items():
            object.__setattr__(self, name, value)


def _layouts(height_obs: bool) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """The policy and critic layouts.

    :data:`OBS_LAYOUT` (+ ``height_samples``), and the policy columns followed by the quadruped's privileged
    columns, then ``height_samples`` (the critic's always).
    """
    policy = dict(OBS_LAYOUT)
    if height_obs:
        policy["height_samples"] = (OBS_DIM, OBS_DIM + NUM_HEIGHT_POINTS)
    width = OBS_DIM + (NUM_HEIGHT_POINTS if height_obs else 0)
    critic = dict(policy)
    shift = width - OBS_DIM
    for name, (a, b) in CRITIC_OBS_LAYOUT.items():
        if name not in OBS_LAYOUT:
            critic[name] = (a + shift, b + shift)
    start = CRITIC_OBS_DIM + shift
    critic["critic_height_samples"] = (start, start + NUM_HEIGHT_POINTS)
    return policy, critic


class RoughTask(QuadrupedTask):
    """``UniLab/QuadrupedRough-v0``'s task (see the module docstring).

    Observation: :data:`~unilab_gym.tasks.quadruped.OBS_LAYOUT` (48), with ``height_obs=True`` followed by
    ``height_samples`` (187: the base's height in m above each point of
    :data:`~unilab_gym.tasks.terrain.HEIGHT_POINTS`, clipped to :data:`HEIGHT_SAMPLE_RANGE`). Critic: the policy
    columns, the quadruped's privileged columns (with ``base_height`` above the terrain), then
    ``critic_height_samples`` (187). The layouts are the instance's :attr:`obs_layout` and :attr:`critic_obs_layout`.

    Attributes:
        terrain_level: (N,) int64, each env's level in its current episode (``info["terrain_level"]``).
        terrain_type: (N,) int64, each env's terrain type (index in :data:`~unilab_gym.tasks.terrain.TERRAIN_TYPES`,
            ``info["terrain_type"]``).
    """

    episode_parameter_names = ("terrain_level", "terrain_type")
    #: Following the base (its height too, as it climbs), from 2 m: the robot and the terrain around it.
    camera = Camera(follow="base", offset=(0.0, 0.0, 0.0), distance=2.0, yaw=30.0, pitch=-30.0)
    config: RoughConfig

    def __init__(self, num_envs: int, config: RoughConfig):
        """Set up ``num_envs`` envs of ``config`` with a terrain tile each and the curriculum's levels."""
        super().__init__(num_envs, config)
        # the widths depend on height_obs: per instance (the engine reads them from the task object)
        self.obs_layout, self.critic_obs_layout = _layouts(config.height_obs)  # type: ignore[misc]
        self.obs_dim = max(b for _, b in self.obs_layout.values())  # type: ignore[misc]
        self.critic_obs_dim = max(b for _, b in self.critic_obs_layout.values())  # type: ignore[misc]
        self.scene = Scene(terrain=True)
        cells = tile_cells(config.terrain_size, config.terrain_border, HORIZONTAL_SCALE)
        self._tiles = TerrainEpisodes.zeros(num_envs, cells, HORIZONTAL_SCALE)
        self.terrain = self._tiles
        self.terrain_level = np.full(num_envs, config.init_terrain_level, dtype=np.int64)
        self.terrain_type = np.zeros(num_envs, dtype=np.int64)
        p = np.array(config.terrain_proportions)
        self._cumulative = np.cumsum(p / p.sum())
        self._episode_length_s = config.max_episode_steps * config.control_dt
        self._final_xy = np.zeros((num_envs, 2))  # base x, y at the last evaluated step
        self._steps = np.zeros(num_envs, dtype=np.int64)  # evaluated steps of the current episode
        self._base_height = np.zeros(num_envs)  # base height above the terrain, m
        self._height_samples = np.zeros((num_envs, NUM_HEIGHT_POINTS))
        self._off_tile = np.zeros(num_envs, dtype=bool)

    @classmethod
    def config_type(cls) -> type:
        """:class:`RoughConfig`."""
        return RoughConfig

    def sample_episode(self, env: int, rng: np.random.Generator) -> np.ndarray:
        """Advance the curriculum and draw the episode, its terrain type and its tile.

        The curriculum step for the episode that ended (if it had any step), then :class:`QuadrupedTask`'s draws,
        then the terrain type (1 draw) and the tile's seed (1 draw); the tile is made from that seed.
        """
        config = self.config
        if config.terrain_curriculum and self._steps[env] > 0:
            distance = np.hypot(*(self._final_xy[env] - self._tiles.origin[env]))
            commanded = np.hypot(*self.command[env, :2]) * self._episode_length_s
            # legged_gym draws the random level of an env past the hardest from a global stream; ours: a stream of
            # the env's level and distance (a pure function of its history)
            wrap = np.random.default_rng([int(self.terrain_level[env]), int(distance * 1e6)])
            self.terrain_level[env] = curriculum_step(
                self.terrain_level[env : env + 1],
                np.array([distance]),
                np.array([commanded]),
                config.terrain_size,
                config.terrain_levels,
                wrap.integers(0, config.terrain_levels, 1),
            )[0]
        joint_pos = super().sample_episode(env, rng)
        self.terrain_type[env] = int(np.searchsorted(self._cumulative, rng.uniform(), side="right"))
        self.terrain_type[env] = min(self.terrain_type[env], len(TERRAIN_TYPES) - 1)
        tile_rng = np.random.default_rng(rng.integers(2**63))
        difficulty = self.terrain_level[env] / max(config.terrain_levels - 1, 1)
        self._tiles.heights[env] = make_tile(
            int(self.terrain_type[env]),
            float(difficulty),
            tile_rng,
            config.terrain_size,
            config.terrain_border,
            self._tiles.horizontal_scale,
        )
        self.episode_parameters[env] = (self.terrain_level[env], self.terrain_type[env])
        return joint_pos

    @classmethod
    def replay_kwargs(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        """``init_terrain_level``: the recorded ``terrain_level``.

        The curriculum's level depends on the env's earlier episodes; the terrain type and tile come from the episode
        seed.
        """
        return {"init_terrain_level": int(parameters["terrain_level"])}

    def start_episodes(self, idx: np.ndarray) -> None:
        """Feet air times and the step count back to 0."""
        super().start_episodes(idx)
        self._steps[idx] = 0

    def _measure(self, state: RobotState) -> None:
        """Base height above the terrain, the height samples and whether the base left its tile's core."""
        rel = state.base_pos[:, :2] - self._tiles.origin
        heights, scale = self._tiles.heights, self._tiles.horizontal_scale
        ground = sample_heights(heights, scale, rel[:, None, :])[:, 0]
        self._base_height = state.base_pos[:, 2] - ground
        x, y, z, w = state.base_quat.T  # the base's yaw (legged_gym quat_apply_yaw: the points turn with the heading)
        yaw = np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
        cos, sin = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
        px, py = HEIGHT_POINTS[None, :, 0], HEIGHT_POINTS[None, :, 1]
        points = np.stack([rel[:, 0:1] + cos * px - sin * py, rel[:, 1:2] + sin * px + cos * py], axis=-1)
        self._height_samples = np.clip(
            state.base_pos[:, 2:3] - sample_heights(heights, scale, points), *HEIGHT_SAMPLE_RANGE
        )
        self._off_tile = np.max(np.abs(rel), axis=1) > self.config.terrain_size / 2.0

    def observe(self, state: RobotState, last_action: np.ndarray, out: np.ndarray) -> None:
        """:class:`QuadrupedTask`'s observation (48 columns), then the height samples with ``height_obs``."""
        self._measure(state)
        super().observe(state, last_action, out[:, :OBS_DIM])
        if self.config.height_obs:
            out[:, slice(*self.obs_layout["height_samples"])] = self._height_samples

    def critic_observe(self, state: RobotState, obs: np.ndarray, parameters: np.ndarray, out: np.ndarray) -> None:
        """Write the critic observation into ``out``.

        The policy columns, the quadruped's privileged columns (base height above the terrain), the height samples.
        """
        quadruped = np.empty((obs.shape[0], CRITIC_OBS_DIM), np.float32)
        critic_observation(
            obs[:, :OBS_DIM], parameters, self._base_height, state.foot_contact, self.feet_air_time, out=quadruped
        )
        width = obs.shape[1]
        out[:, :width] = obs
        out[:, width : width + CRITIC_OBS_DIM - OBS_DIM] = quadruped[:, OBS_DIM:]
        out[:, slice(*self.critic_obs_layout["critic_height_samples"])] = self._height_samples

    def evaluate(
        self, state: RobotState, action: np.ndarray, previous_action: np.ndarray, restarting: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """:class:`QuadrupedTask`'s terms and fall conditions, with the base height above the terrain.

        The height is :meth:`base_height`; also records where each base is (for the curriculum).
        """
        terms, conditions = super().evaluate(state, action, previous_action, restarting)
        self._final_xy[:] = state.base_pos[:, :2]
        self._steps += 1
        self._steps[restarting] = 0
        return terms, conditions

    def base_height(self, state: RobotState) -> np.ndarray:
        """(N,) float64 base height in m above the terrain under the base (computed in :meth:`observe`)."""
        return self._base_height

    def truncation(self, episode_step: np.ndarray, max_episode_steps: int) -> np.ndarray:
        """``max_episode_steps`` reached, or the base left its tile's core."""
        return (episode_step >= max_episode_steps) | self._off_tile

    def step_info(self) -> dict[str, np.ndarray]:
        """``terrain_level`` and ``terrain_type`` (N,) int64 of each env's current episode."""
        return {"terrain_level": self.terrain_level.copy(), "terrain_type": self.terrain_type.copy()}
