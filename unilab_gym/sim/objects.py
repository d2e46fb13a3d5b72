"""Free rigid objects in a cluster world: the physics side of ``Scene(objects=True)``.

One object per robot, built anew at each of its episodes.

An episode's object has its own shape (box, cylinder or sphere), size, mass and friction
(:class:`~unilab_gym.sim.scene.ObjectEpisodes`, drawn by the task). pybullet cannot resize a collision shape once it
is made, so :meth:`ObjectSet.reset` removes the env's old body and creates a new one: a collision shape of the exact
size, its mass (pybullet computes the solid shape's inertia), its friction. Bodies are only created and removed
inside a reset, and only that env's, so an env's trajectory does not depend on its neighbours.

Collision shapes are cached per world by (shape, size) and shared by the bodies that need them: pybullet 3.2.7 never
frees a collision shape a body has used (``removeCollisionShape`` refuses: "Don't remove collision shape: it is
used"), so a new shape per episode would grow memory without bound. The tasks draw sizes in whole millimetres
(:data:`unilab_gym.tasks.panda.SIZE_RESOLUTION`), which bounds the cache (at most 3 x 71 shapes within the gripper's
8 cm). pybullet 3.2.7 also keeps ~0.9 KB per removed body (measured: 17 MB of RSS over 20,000 create/remove cycles
of one box, with or without ``useMaximalCoordinates``): ~9 MB per 10,000 episodes of a world.

Isolation: an object is in collision group 4 with mask 1 (the ground's group), so by the group/mask rule it touches
only the ground; each link of its own robot is then paired with it by ``setCollisionFilterPair(enable=1)``, a rule
that pybullet's collision filter applies before the group/mask rule. Before an object is removed its pairs are set
to ``enable=0``, so a later body that reuses its unique id never inherits them. Robots and objects of other envs
never touch, wherever their lanes put them.
"""

from __future__ import annotations

import numpy as np

from unilab_gym.sim.scene import OBJECT_SHAPES

_OBJECT_GROUP = 4  # collision group of every object
_GROUND_GROUP = 1  # the ground's (unilab_gym.sim.world)


class ObjectSet:
    """The objects of one world: object ``i`` belongs to robot ``i``.

    Args:
        p: the pybullet module (the physics layer passes it: only :mod:`unilab_gym.sim` imports pybullet).
        client: the world's physics client id.
        robots: the robots' body ids, one per object.
        robot_links: the link indices of a robot (-1 for the base and each joint's child link).

    Attributes:
        bodies: (n,) body id of each object (-1 before its first reset).
    """

    def __init__(self, p, client: int, robots: list[int], robot_links: list[int]):
        """Start with no bodies and an empty collision-shape cache (arguments: see the class docstring)."""
        self._p = p
        self._client = client
        self._robots = list(robots)
        self._links = list(robot_links)
        self.bodies = np.full(len(robots), -1, dtype=np.int64)
        self._shapes: dict[tuple[str, tuple[float, ...]], int] = {}  # (shape, extents) -> collision shape id

    def reset(
        self,
        idx: np.ndarray,
        base_pos: np.ndarray,
        shape: np.ndarray,
        size: np.ndarray,
        mass: np.ndarray,
        friction: np.ndarray,
        position: np.ndarray,
        yaw: np.ndarray,
    ) -> None:
        """Replace the objects ``idx`` by new ones at rest.

        Args:
            idx: (k,) int, object (= robot) indices in this world.
            base_pos: (k, 3) m, each robot's base position after its reset, world frame.
            shape: (k,) int, index into :data:`~unilab_gym.sim.scene.OBJECT_SHAPES`.
            size: (k, 3) m, full extents (as in :class:`~unilab_gym.sim.scene.ObjectEpisodes`).
            mass: (k,) kg.
            friction: (k,) lateral friction coefficient.
            position: (k, 3) m, relative to ``base_pos``, world frame.
            yaw: (k,) rad, about the world z axis.
        """
        p, c = self._p, self._client
        for row, i in enumerate(idx):
            self._remove(int(i))
            collision = self._shape(OBJECT_SHAPES[int(shape[row])], tuple(float(v) for v in size[row]))
            where = (base_pos[row] + position[row]).tolist()
            half = 0.5 * float(yaw[row])
            body = p.createMultiBody(
                float(mass[row]),
                collision,
                -1,
                where,
                [0.0, 0.0, float(np.sin(half)), float(np.cos(half))],
                physicsClientId=c,
            )
            p.changeDynamics(body, -1, lateralFriction=float(friction[row]), physicsClientId=c)
            p.setCollisionFilterGroupMask(body, -1, _OBJECT_GROUP, _GROUND_GROUP, physicsClientId=c)
            robot = self._robots[int(i)]
            for link in self._links:
                p.setCollisionFilterPair(robot, body, link, -1, 1, physicsClientId=c)
            self.bodies[i] = body

    def _shape(self, kind: str, extents: tuple[float, ...]) -> int:
        """The world's collision shape of ``kind`` with full extents ``extents`` (m), made at its first use."""
        key = (kind, extents)
        if key not in self._shapes:
            p, c = self._p, self._client
            if kind == "box":
                made = p.createCollisionShape(p.GEOM_BOX, halfExtents=[0.5 * v for v in extents], physicsClientId=c)
            elif kind == "cylinder":
                made = p.createCollisionShape(
                    p.GEOM_CYLINDER, radius=0.5 * extents[0], height=extents[2], physicsClientId=c
                )
            else:
                made = p.createCollisionShape(p.GEOM_SPHERE, radius=0.5 * extents[0], physicsClientId=c)
            self._shapes[key] = made
        return self._shapes[key]

    def _remove(self, i: int) -> None:
        """Remove object ``i``'s body, if any (its robot pairs disabled first; its shape stays cached)."""
        body = int(self.bodies[i])
        if body < 0:
            return
        p, c = self._p, self._client
        robot = self._robots[i]
        for link in self._links:
            p.setCollisionFilterPair(robot, body, link, -1, 0, physicsClientId=c)
        p.removeBody(body, physicsClientId=c)
        self.bodies[i] = -1

    def read(self, pos: np.ndarray, quat: np.ndarray, lin_vel: np.ndarray, ang_vel: np.ndarray) -> None:
        """Write every object's pose and velocity, world frame, into the given arrays.

        Position (n, 3) m, orientation (n, 4) xyzw, linear (n, 3) m/s and angular (n, 3) rad/s
        velocity; zeros for an object not yet made.
        """
        p, c = self._p, self._client
        for i, body in enumerate(self.bodies.tolist()):
            if body < 0:
                pos[i] = lin_vel[i] = ang_vel[i] = 0.0
                quat[i] = (0.0, 0.0, 0.0, 1.0)
                continue
            xyz, xyzw = p.getBasePositionAndOrientation(body, physicsClientId=c)
            lin, ang = p.getBaseVelocity(body, physicsClientId=c)
            pos[i] = xyz
            quat[i] = xyzw
            lin_vel[i] = lin
            ang_vel[i] = ang
