"""Per-robot heightfield tiles in one pybullet world (``Scene(terrain=True)``), for the physics layer.

Each robot has its own tile: a static pybullet heightfield (``GEOM_HEIGHTFIELD``) whose heights are replaced at
each of its episodes from the task's height map (:mod:`unilab_gym.tasks.terrain`), centred on the robot's spawn
point. A tile collides with its own robot only: tiles are in a collision group no robot's mask has (they collide
with nothing), and one ``setCollisionFilterPair`` per link of the tile's robot enables that robot (pybullet's custom
pair filters are checked before the group masks). Robots that share a lane (chosen by episode seed, see
:mod:`unilab_gym.sim.world`) stand on overlapping tiles and never touch each other's.

Determinism (measured, pybullet 3.2.7, an A1 under random actions on a random tile, 300 control steps): the robot's
trajectory is bit-identical alone and among neighbours on their own tiles in the same lane, 1 m and 2 m away, whatever
the order the robots and tiles were created in. What a trajectory depends on is where the robot and its tile are: both
come from the episode seed (the lane) and the task's tile (from the episode seed and the terrain level).

Each robot's tile is one body and one heightfield shape for the world's life: at each episode its data is replaced
(``createCollisionShape(replaceHeightfieldIndex=...)``) and the body moved to the new centre. pybullet keeps a
heightfield's height range from its creation, by which it centres the shape and bounds it (its AABB): replacing the
data with another range would put the tile at the wrong height and lose contacts above the old maximum (measured: 0.3 m
off). So every tile's range is pinned: its two far corner points (in the flat border, outside the core a robot walks
on) are set to -:data:`MAX_HEIGHT` and +:data:`MAX_HEIGHT` m, and the shape is centred at z = 0. (Removing the body and
building a new one instead would leak a shape per episode: pybullet 3.2.7 refuses ``removeCollisionShape`` of a shape
a removed body used.)

Rendering (``visual=True``, the worlds of an env with a render mode): pybullet's TinyRenderer draws a body without a
visual shape from its collision shape, but meshes a heightfield shape once and keeps that mesh for the shape's life
(measured, pybullet 3.2.7: the frame is unchanged after ``replaceHeightfieldIndex``, even for a new body made from
the replaced shape). So in a visual world each tile is made with a hidden visual shape (a 1 mm sphere 100 m under the
ground), and :meth:`TerrainSet.show` draws the tile of the robot being rendered with a *display body*: a visual-only
body (no collision shape: it touches nothing, so the physics is the same with or without it) whose mesh is made from
the tile's current heights (without the pinned corners), tinted :data:`TILE_COLOR` over pybullet's checker texture
(1 m squares, as the plane's). It is made again only when the rendered robot or its episode changed, after the
previous one is removed. pybullet never frees a visual shape: each new display keeps about 3 MB (measured, a 101 x 101
tile), so rendering every episode of a long run grows the process by that much per episode rendered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pybullet_data

_TILE_GROUP = 4  # a collision group no robot's mask (the ground's group 1) has: pair filters enable each tile

#: Bound in m of every tile height (|h| < MAX_HEIGHT); the pinned corners of each tile (see the module docstring).
MAX_HEIGHT = 4.0

#: RGBA tint of a rendered tile (sand, over pybullet's default checker texture).
TILE_COLOR = (0.85, 0.72, 0.55, 1.0)


class TerrainSet:
    """One heightfield tile per robot of a world.

    Args:
        p: the pybullet module.
        client: the physics client id.
        robots: the robots' body ids (tile ``i`` belongs to robot ``i``).
        links: the robots' link indices (-1 and each joint's child link).
        friction: lateral friction coefficient of the tiles (the scene's ``ground_friction``).
        visual: the world renders: tiles get a hidden visual shape and are drawn by :meth:`show`.
    """

    def __init__(self, p: Any, client: int, robots: list[int], links: list[int], friction: float,
                 visual: bool = False):  # fmt: skip
        """Start with no tiles (arguments: see the class docstring)."""
        self._p = p
        self._c = client
        self._robots = robots
        self._links = links
        self._friction = friction
        self.tiles: list[int | None] = [None] * len(robots)
        self._shapes: list[int | None] = [None] * len(robots)
        self._cells: tuple[int, int, float] | None = None  # (ny, nx, horizontal_scale) of the tiles
        self._centres = np.zeros((len(robots), 3))
        self._versions = np.zeros(len(robots), dtype=np.int64)  # episodes each tile was given
        self._hidden = (
            p.createVisualShape(
                p.GEOM_SPHERE, radius=1e-3, visualFramePosition=[0.0, 0.0, -100.0], physicsClientId=client
            )
            if visual
            else -1
        )
        self._display: tuple[int, int, int] | None = None  # (body, robot, version) of the display body
        self._heights: list[np.ndarray | None] = [None] * len(robots)  # each tile's heights, unpinned (visual only)
        self._texture = (
            p.loadTexture(f"{pybullet_data.getDataPath()}/checker_blue.png", physicsClientId=client) if visual else -1
        )

    def reset(self, idx: np.ndarray, centres: np.ndarray, heights: np.ndarray, horizontal_scale: float) -> None:
        """Give robots ``idx`` new tiles.

        Args:
            idx: (k,) int, robot indices in the world.
            centres: (k, 2) m, world x, y of each tile's centre.
            heights: (k, n, n) float32 heights in m (row = y, column = x, :func:`unilab_gym.tasks.terrain.make_tile`),
                centred on the tile's centre; a height ``h`` is at world z = ``h``. The same n and
                ``horizontal_scale`` at every call.
            horizontal_scale: grid spacing in m.

        Raises:
            ValueError: a height not within (-MAX_HEIGHT, MAX_HEIGHT) m, or a tile of another size than the first.
        """
        p, c = self._p, self._c
        for row, i in enumerate(idx):
            tile = np.array(heights[row], dtype=np.float32)
            if not np.all(np.abs(tile) < MAX_HEIGHT):
                raise ValueError(
                    f"terrain heights must be within (-{MAX_HEIGHT}, {MAX_HEIGHT}) m, got a tile with "
                    f"heights in [{tile.min()}, {tile.max()}]"
                )
            if self._hidden != -1:
                self._heights[i] = tile.copy()
            tile[0, 0], tile[-1, -1] = -MAX_HEIGHT, MAX_HEIGHT  # pin the range (far corners of the border)
            ny, nx = tile.shape
            if self._cells is not None and self._cells != (ny, nx, horizontal_scale):
                raise ValueError(
                    f"every tile must have the first one's size {self._cells}, got {(ny, nx, horizontal_scale)}"
                )
            self._cells = (ny, nx, horizontal_scale)
            shape = p.createCollisionShape(
                p.GEOM_HEIGHTFIELD,
                meshScale=[horizontal_scale, horizontal_scale, 1.0],
                heightfieldData=tile.ravel().tolist(),
                numHeightfieldRows=nx,  # pybullet's "rows" run along x: data[ix + iy * nx]
                numHeightfieldColumns=ny,
                replaceHeightfieldIndex=-1 if self._shapes[i] is None else self._shapes[i],
                physicsClientId=c,
            )
            centre = [float(centres[row, 0]), float(centres[row, 1]), 0.0]  # the range is centred on z = 0
            self._centres[i] = centre
            self._versions[i] += 1
            body = self.tiles[i]
            if body is None:
                self._shapes[i] = shape
                body = p.createMultiBody(0.0, shape, self._hidden, centre, physicsClientId=c)
                p.changeDynamics(body, -1, lateralFriction=self._friction, physicsClientId=c)
                p.setCollisionFilterGroupMask(body, -1, _TILE_GROUP, 0, physicsClientId=c)
                for link in self._links:
                    p.setCollisionFilterPair(body, self._robots[i], -1, link, 1, physicsClientId=c)
                self.tiles[i] = body
            else:
                p.resetBasePositionAndOrientation(body, centre, [0.0, 0.0, 0.0, 1.0], physicsClientId=c)

    def show(self, robot: int) -> None:
        """Draw robot ``robot``'s current tile in the next camera image, and no other (``visual=True`` only).

        Makes the display body (see the module docstring) when the robot or its episode changed since the last call;
        a robot whose tile was never given heights shows none.

        Raises:
            RuntimeError: the set was made without ``visual=True``.
        """
        if self._hidden == -1:
            raise RuntimeError("TerrainSet.show needs a TerrainSet made with visual=True")
        p, c = self._p, self._c
        key = (robot, int(self._versions[robot]))
        if self._display is not None and self._display[1:] == key:
            return
        if self._display is not None:
            p.removeBody(self._display[0], physicsClientId=c)
            self._display = None
        heights = self._heights[robot]
        if heights is None or self._cells is None:
            return
        vertices, normals, uvs, indices = tile_mesh(heights, self._cells[2])
        shape = p.createVisualShape(
            p.GEOM_MESH,
            vertices=vertices.tolist(),
            indices=indices.tolist(),
            normals=normals.tolist(),
            uvs=uvs.tolist(),
            rgbaColor=list(TILE_COLOR),
            physicsClientId=c,
        )
        body = p.createMultiBody(0.0, -1, shape, self._centres[robot].tolist(), physicsClientId=c)
        p.changeVisualShape(body, -1, textureUniqueId=self._texture, rgbaColor=list(TILE_COLOR), physicsClientId=c)
        self._display = (body, *key)

    def contact_points(self) -> list[tuple]:
        """Every tile-robot contact point of the last physics step.

        As pybullet ``getContactPoints`` tuples: body A the tile, body B its robot, link B the robot's link.
        """
        p, c = self._p, self._c
        points: list[tuple] = []
        for body in self.tiles:
            if body is not None:
                points.extend(p.getContactPoints(bodyA=body, physicsClientId=c))
        return points


def tile_mesh(heights: np.ndarray, horizontal_scale: float) -> tuple[np.ndarray, ...]:
    """A triangle mesh of a tile, centred on its centre, for drawing.

    Args:
        heights: (ny, nx) heights in m (row = y, column = x).
        horizontal_scale: grid spacing in m.

    Returns:
        ``(vertices, normals, uvs, indices)``: (ny * nx, 3) float64 m, (ny * nx, 3) unit normals (from the heights'
        central differences, :func:`numpy.gradient`), (ny * nx, 2) texture coordinates (half a unit per m: 1 m
        squares of pybullet's 2 x 2 checker, as its plane), and (6 (ny - 1)(nx - 1),) int32 vertex indices, two
        counter-clockwise triangles per cell seen from above.
    """
    ny, nx = heights.shape
    ys, xs = np.meshgrid((np.arange(ny) - (ny - 1) / 2) * horizontal_scale,
                         (np.arange(nx) - (nx - 1) / 2) * horizontal_scale, indexing="ij")  # fmt: skip
    vertices = np.stack([xs, ys, heights.astype(np.float64)], axis=-1).reshape(-1, 3)
    dh_dy, dh_dx = np.gradient(heights.astype(np.float64), horizontal_scale)
    normals = np.stack([-dh_dx, -dh_dy, np.ones_like(dh_dx)], axis=-1).reshape(-1, 3)
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    uvs = vertices[:, :2] / 2.0
    grid = np.arange(ny * nx, dtype=np.int32).reshape(ny, nx)
    a, b, c, d = grid[:-1, :-1], grid[:-1, 1:], grid[1:, :-1], grid[1:, 1:]  # (x, y), (x+1, y), (x, y+1), (x+1, y+1)
    indices = np.stack([a, b, d, a, d, c], axis=-1).reshape(-1)
    return vertices, normals, uvs, indices
