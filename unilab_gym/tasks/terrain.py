"""Heightfield terrain tiles, pure numpy: generation (legged_gym's terrain types), height sampling and the curriculum.

Nothing here touches physics: a tile is an (ny, nx) float32 array of heights in m on a square grid of
``horizontal_scale`` m, row ``iy`` along y, column ``ix`` along x, centred on the tile's origin (the physics layer,
:mod:`unilab_gym.sim.terrain`, builds a pybullet heightfield from it, centred the same way).

The terrain types, their difficulty scaling and the curriculum rule follow legged_gym (Rudin et al. 2022, "Learning
to Walk in Minutes Using Massively Parallel Deep Reinforcement Learning", ``legged_gym/utils/terrain.py``
``Terrain.make_terrain`` and ``legged_robot.py`` ``_update_terrain_curriculum``), with the shapes of Isaac Gym's
``terrain_utils`` (``pyramid_sloped_terrain``, ``random_uniform_terrain``, ``pyramid_stairs_terrain``,
``discrete_obstacles_terrain``). For a difficulty ``d`` in [0, 1]:

=========================  =================================================================================
type                       tile
=========================  =================================================================================
``smooth_slope``           a pyramid (or, half of the time, an inverted pyramid) of slope ``0.4 d`` (rise over
                           run) with a flat 3 m platform at the centre
``rough_slope``            the pyramid of slope ``0.4 d``, plus uniform noise in [-0.05, 0.05] m on a 0.2 m grid
``stairs_up``              concentric steps 0.31 m wide, ``0.05 + 0.18 d`` m high, going *up* away from the
                           centre (legged_gym's negative ``step_height``: the robot starts at the bottom)
``stairs_down``            the same steps going down away from the centre (it starts on the top platform)
``discrete_obstacles``     20 rectangles of 1 to 2 m, each ``+-(0.05 + 0.2 d)`` or ``+-(0.05 + 0.2 d) / 2`` m high,
                           the central 3 m platform flat
=========================  =================================================================================

Default proportions (legged_gym ``terrain_proportions``): 0.1, 0.1, 0.35, 0.25, 0.2. A flat border (height 0) of
``border`` m rings the ``size`` m core of every tile.
"""

from __future__ import annotations

import numpy as np

#: The terrain types, by code (the ``terrain_type`` episode parameter).
TERRAIN_TYPES = ("smooth_slope", "rough_slope", "stairs_up", "stairs_down", "discrete_obstacles")
#: legged_gym's default ``terrain_proportions`` of :data:`TERRAIN_TYPES`.
DEFAULT_PROPORTIONS = (0.1, 0.1, 0.35, 0.25, 0.2)
#: Side in m of the flat platform at a tile's centre (legged_gym ``platform_size=3.``).
PLATFORM_SIZE = 3.0
#: legged_gym ``horizontal_scale``: grid spacing in m.
HORIZONTAL_SCALE = 0.1
#: Height-sample points in the base's yaw frame, m (legged_gym ``measured_points_x`` and ``measured_points_y``):
#: x from -0.8 to 0.8, y from -0.5 to 0.5, every 0.1 m; 17 x 11 = 187 points, x-major.
MEASURED_POINTS_X = np.round(np.arange(-8, 9) * 0.1, 10)
MEASURED_POINTS_Y = np.round(np.arange(-5, 6) * 0.1, 10)
HEIGHT_POINTS = np.stack(np.meshgrid(MEASURED_POINTS_X, MEASURED_POINTS_Y, indexing="ij"), axis=-1).reshape(-1, 2)
#: Number of height samples: 187.
NUM_HEIGHT_POINTS = HEIGHT_POINTS.shape[0]


def tile_cells(size: float, border: float, horizontal_scale: float = HORIZONTAL_SCALE) -> int:
    """Grid points along one side of a tile of ``size`` m core and ``border`` m border.

    ``round((size + 2 border) / scale) + 1`` (odd, so that the centre is a grid point).
    """
    n = round((size + 2.0 * border) / horizontal_scale) + 1
    return n if n % 2 else n + 1


def _pyramid(coord: np.ndarray, half: float, slope: float, platform: float) -> np.ndarray:
    """Isaac Gym's ``pyramid_sloped_terrain`` on coordinates ``coord`` (m from the centre, (ny, nx, 2)).

    Height ``slope * half * xx * yy`` with ``xx = 1 - |x| / half`` (0 at the core's edge), clipped to its value at
    the platform's edge inside the platform.
    """
    xx = np.clip(1.0 - np.abs(coord[..., 0]) / half, 0.0, 1.0)
    yy = np.clip(1.0 - np.abs(coord[..., 1]) / half, 0.0, 1.0)
    height = slope * half * xx * yy
    edge = slope * half * (1.0 - platform / 2.0 / half) ** 2
    return np.minimum(height, edge) if slope >= 0 else np.maximum(height, edge)


def _stairs(coord: np.ndarray, half: float, step_width: float, step_height: float, platform: float) -> np.ndarray:
    """Isaac Gym's ``pyramid_stairs_terrain``.

    Concentric squares ``step_width`` narrower each, ``step_height`` higher each, until the remaining square is the
    platform.
    """
    dist = half - np.maximum(np.abs(coord[..., 0]), np.abs(coord[..., 1]))  # from the core's edge inward, m
    max_steps = int(np.floor((half - platform / 2.0) / step_width))
    steps = np.clip(np.floor(dist / step_width), 0, max_steps)
    return np.where(dist > 0, steps * step_height, 0.0)


def _uniform_noise(
    rng: np.random.Generator, coord: np.ndarray, half: float, low: float, high: float, step: float, grid: float
) -> np.ndarray:
    """Isaac Gym's ``random_uniform_terrain``.

    Heights drawn from ``arange(low, high + step, step)`` on a coarse grid of ``grid`` m, bilinearly interpolated to
    the tile's grid.
    """
    levels = np.arange(low, high + step / 2, step)
    n = int(np.ceil(2 * half / grid)) + 1
    coarse = rng.choice(levels, (n, n))
    u = np.clip((coord[..., 0] + half) / grid, 0, n - 1 - 1e-9)
    v = np.clip((coord[..., 1] + half) / grid, 0, n - 1 - 1e-9)
    i0, j0 = np.floor(v).astype(int), np.floor(u).astype(int)
    fy, fx = v - i0, u - j0
    top = coarse[i0, j0] * (1 - fx) + coarse[i0, j0 + 1] * fx
    bottom = coarse[i0 + 1, j0] * (1 - fx) + coarse[i0 + 1, j0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def make_tile(
    kind: int,
    difficulty: float,
    rng: np.random.Generator,
    size: float = 8.0,
    border: float = 1.0,
    horizontal_scale: float = HORIZONTAL_SCALE,
) -> np.ndarray:
    """One terrain tile (legged_gym ``make_terrain``, see the module docstring).

    Args:
        kind: index in :data:`TERRAIN_TYPES`.
        difficulty: in [0, 1] (legged_gym: level / number of levels).
        rng: the tile's own random stream (slope direction, noise, obstacles).
        size: side of the core in m (legged_gym ``terrain_length`` 8 m).
        border: width of the flat ring around the core in m.
        horizontal_scale: grid spacing in m.

    Returns:
        (n, n) float32 heights in m, ``n = tile_cells(size, border, horizontal_scale)``, row = y, column = x; 0 on
        the border.

    Raises:
        ValueError: an unknown ``kind`` or a ``difficulty`` outside [0, 1].
    """
    if not 0 <= int(kind) < len(TERRAIN_TYPES):
        raise ValueError(f"kind must be in [0, {len(TERRAIN_TYPES)}), got {kind!r}")
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError(f"difficulty must be in [0, 1], got {difficulty!r}")
    n = tile_cells(size, border, horizontal_scale)
    axis = (np.arange(n) - (n - 1) / 2) * horizontal_scale
    coord = np.stack(np.meshgrid(axis, axis, indexing="xy"), axis=-1)  # (ny, nx, 2): [..., 0] x, [..., 1] y
    half = size / 2.0
    slope = difficulty * 0.4
    step_height = 0.05 + 0.18 * difficulty
    obstacle_height = 0.05 + difficulty * 0.2
    name = TERRAIN_TYPES[int(kind)]
    if name == "smooth_slope":
        sign = -1.0 if rng.uniform() < 0.5 else 1.0
        height = _pyramid(coord, half, sign * slope, PLATFORM_SIZE)
    elif name == "rough_slope":
        height = _pyramid(coord, half, slope, PLATFORM_SIZE)
        height = height + _uniform_noise(rng, coord, half, -0.05, 0.05, 0.005, 0.2)
    elif name in ("stairs_up", "stairs_down"):
        sign = -1.0 if name == "stairs_up" else 1.0
        height = _stairs(coord, half, 0.31, sign * step_height, PLATFORM_SIZE)
    else:  # discrete_obstacles
        height = np.zeros((n, n))
        cells = round(size / horizontal_scale)
        offset = (n - 1 - cells) // 2  # first core cell
        choices = np.array([-obstacle_height, -obstacle_height / 2, obstacle_height / 2, obstacle_height])
        lo, hi = round(1.0 / horizontal_scale), round(2.0 / horizontal_scale)
        for _ in range(20):
            w, length = rng.integers(lo, hi + 1, 2)
            i, j = rng.integers(0, cells - w), rng.integers(0, cells - length)
            height[offset + i : offset + i + w, offset + j : offset + j + length] = rng.choice(choices)
        platform = np.maximum(np.abs(coord[..., 0]), np.abs(coord[..., 1])) <= PLATFORM_SIZE / 2
        height[platform] = 0.0
    core = np.maximum(np.abs(coord[..., 0]), np.abs(coord[..., 1])) <= half
    return np.where(core, height, 0.0).astype(np.float32)


def sample_heights(heights: np.ndarray, horizontal_scale: float, points: np.ndarray) -> np.ndarray:
    """Heights in m of the tiles at points given relative to each tile's centre, bilinear between grid points.

    Args:
        heights: (N, n, n) float32 tiles (:func:`make_tile`).
        horizontal_scale: their grid spacing in m.
        points: (N, P, 2) float64 x, y in m relative to each tile's centre; points off the tile read the nearest
            edge point.

    Returns:
        (N, P) float64. (The physics heightfield splits each cell into two triangles; bilinear and triangle values
        differ inside a cell only where it is not planar, by at most the cell's height differences.)
    """
    n_env, n = heights.shape[0], heights.shape[-1]
    u = np.clip(points[..., 0] / horizontal_scale + (n - 1) / 2, 0.0, n - 1 - 1e-9)  # column (x)
    v = np.clip(points[..., 1] / horizontal_scale + (n - 1) / 2, 0.0, n - 1 - 1e-9)  # row (y)
    j0 = np.floor(u).astype(np.int64)
    i0 = np.floor(v).astype(np.int64)
    fx, fy = u - j0, v - i0
    env = np.arange(n_env)[:, None]
    h = heights.astype(np.float64, copy=False)
    top = h[env, i0, j0] * (1 - fx) + h[env, i0, j0 + 1] * fx
    bottom = h[env, i0 + 1, j0] * (1 - fx) + h[env, i0 + 1, j0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def curriculum_step(
    level: np.ndarray,
    distance: np.ndarray,
    commanded_distance: np.ndarray,
    size: float,
    num_levels: int,
    rng_levels: np.ndarray,
) -> np.ndarray:
    """legged_gym's ``_update_terrain_curriculum``: the next episode's level of envs that finished one.

    An env moves up a level when it walked more than half the tile (``distance > size / 2``), down when it walked
    less than half its commanded distance (``distance < commanded_distance / 2``, and not up); a level past the
    hardest goes to a random level (``rng_levels``, legged_gym's ``randint(max_terrain_level)``), and none goes
    under 0.

    Args:
        level: (k,) int64 levels of the finished episodes.
        distance: (k,) m from the tile centre to where the base ended, horizontally.
        commanded_distance: (k,) m, |command_xy| * episode duration (legged_gym ``max_episode_length_s``).
        size: tile core side in m.
        num_levels: number of levels.
        rng_levels: (k,) int64 in [0, num_levels), the levels of those that pass the hardest.

    Returns:
        (k,) int64 levels in [0, num_levels).
    """
    up = distance > size / 2.0
    down = (distance < commanded_distance * 0.5) & ~up
    new = level + up.astype(np.int64) - down.astype(np.int64)
    new = np.where(new >= num_levels, rng_levels, new)
    return np.maximum(new, 0)
