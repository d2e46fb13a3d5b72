"""Rotor model of a quadrotor: motor speeds -> thrusts, drag torques and the wrench on the body (pure numpy).

Nothing here imports pybullet: the task math (:mod:`unilab_gym.tasks.quadrotor`) turns actions into motor speeds
and wrenches with it, and the physics layer applies the wrenches
(:meth:`unilab_gym.sim.world.ClusterWorld.step_external`), as :mod:`unilab_gym.sim.rotation` is shared.

Model (gym-pybullet-drones' ``BaseAviary._physics``, Panerati et al. 2021, "Learning to Fly - a Gym Environment
with PyBullet Physics for Reinforcement Learning of Multi-agent Quadcopter Control"): rotor ``i`` spinning at
``w_i`` rpm pushes the body along its z axis with thrust ``f_i = kf * w_i^2`` (N) at its position ``r_i`` and
twists it about z with drag torque ``s_i * km * w_i^2`` (N·m), ``s_i = -1, +1, -1, +1`` for rotors 0-3. The wrench
at the centre of mass is their sum: force ``(0, 0, sum f_i)``, torque ``sum r_i x (0, 0, f_i)`` plus the drag
torques (the same motion as applying each thrust at its rotor). Not modelled (gym-pybullet-drones' ``Physics.PYB``
leaves them out too): motor dynamics (speeds change instantly), aerodynamic drag, ground effect, downwash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Gravitational acceleration in m/s^2, the physics world's (:data:`unilab_gym.sim.world.GRAVITY`, which this
#: module cannot import without pybullet; a test checks they agree).
GRAVITY = 9.81


@dataclass(frozen=True)
class RotorModel:
    """The rotors of a quadrotor, as data.

    Frames: the base frame has x forward, y left, z up (thrust along +z).

    Raises:
        ValueError: a non-positive mass, coefficient or thrust-to-weight ratio, or not 4 rotor positions and spins.
    """

    mass: float
    """Total mass in kg (the URDF's)."""
    kf: float
    """Thrust coefficient in N/rpm^2: ``f = kf * w^2``."""
    km: float
    """Drag torque coefficient in N·m/rpm^2: ``tau_z = km * w^2``."""
    rotor_xy: tuple[tuple[float, float], ...]
    """(4, 2) rotor positions (x, y) in m, base frame, rotors 0-3."""
    spin: tuple[float, ...]
    """(4,) sign of each rotor's drag torque about the base z axis."""
    thrust_to_weight: float
    """Total thrust at full speed over the weight ``mass * g``: sets :attr:`max_rpm`."""
    inertia: tuple[float, float, float] = (1.4e-5, 1.4e-5, 2.17e-5)
    """Diagonal of the body's inertia tensor in kg·m^2 (the URDF's): what :func:`rate_control` assumes."""

    def __post_init__(self) -> None:
        """Check the fields (see the class docstring for what is refused)."""
        for name in ("mass", "kf", "km", "thrust_to_weight"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"RotorModel: {name} must be a finite number > 0, got {value!r}")
        if np.shape(self.rotor_xy) != (4, 2) or np.shape(self.spin) != (4,):
            raise ValueError(
                f"RotorModel: rotor_xy must be (4, 2) and spin (4,), got {np.shape(self.rotor_xy)} and "
                f"{np.shape(self.spin)}"
            )

    @property
    def hover_rpm(self) -> float:
        """Speed in rpm at which the 4 rotors together carry the weight: ``sqrt(mass * g / (4 kf))``."""
        return math.sqrt(self.mass * GRAVITY / (4.0 * self.kf))

    @property
    def max_rpm(self) -> float:
        """Full speed in rpm: ``sqrt(thrust_to_weight * mass * g / (4 kf))``."""
        return math.sqrt(self.thrust_to_weight * self.mass * GRAVITY / (4.0 * self.kf))

    def wrench(self, rpm: np.ndarray) -> np.ndarray:
        """The wrench of the rotors at speeds ``rpm`` on the body, at its centre of mass.

        Args:
            rpm: (N, 4) float64, each rotor's speed in rpm (>= 0).

        Returns:
            (N, 6) float64, base frame: force (N) then torque (N·m), see the module docstring.
        """
        squared = rpm * rpm
        thrust = self.kf * squared  # (N, 4) N
        out = np.zeros((rpm.shape[0], 6))
        # sums of products written out rotor by rotor, in order: a matrix product (BLAS) rounds differently for
        # different N, and env i must not depend on how many envs share the batch
        for i, ((x, y), spin) in enumerate(zip(self.rotor_xy, self.spin)):
            out[:, 2] += thrust[:, i]
            out[:, 3] += y * thrust[:, i]  # r x (0, 0, f) = (y f, -x f, 0)
            out[:, 4] -= x * thrust[:, i]
            out[:, 5] += spin * self.km * squared[:, i]
        return out

    def rotor_rpm(self, thrust: np.ndarray, torque: np.ndarray) -> np.ndarray:
        """The rotor speeds that give collective ``thrust`` and body ``torque``, each rotor clipped to [0, full speed].

        Inverts the wrench map (``T = sum f_i``, ``tau_x = sum y_i f_i``, ``tau_y = -sum x_i f_i``,
        ``tau_z = (km / kf) sum s_i f_i``) for the rotor thrusts ``f_i``, clips them to [0, ``kf max_rpm^2``] (a
        saturated command loses some of its torque) and returns ``sqrt(f_i / kf)``.

        Args:
            thrust: (N,) float64, N.
            torque: (N, 3) float64, N·m, base frame.

        Returns:
            (N, 4) float64 rpm.
        """
        xy = np.asarray(self.rotor_xy)
        mix = np.stack([np.ones(4), xy[:, 1], -xy[:, 0], np.asarray(self.spin) * self.km / self.kf])
        inverse = np.linalg.inv(mix)  # (4, 4) constant; applied term by term below (no N-dependent BLAS rounding)
        wrench = np.column_stack([thrust, torque])
        force = np.zeros((thrust.shape[0], 4))
        for i in range(4):
            for j in range(4):
                force[:, i] += inverse[i, j] * wrench[:, j]
        return np.sqrt(np.clip(force, 0.0, self.kf * self.max_rpm**2) / self.kf)


def rate_control(
    model: RotorModel, thrust: np.ndarray, rates: np.ndarray, body_rates: np.ndarray, period: float
) -> np.ndarray:
    """Rotor speeds (N, 4) rpm for a collective ``thrust`` (N,) N and body ``rates`` (N, 3) rad/s.

    A one-step (deadbeat) rate loop run once per control period: the torque ``J (rates - body_rates) / period``
    brings the body rates to the command in one ``period`` s if no rotor saturates (``J``: :attr:`RotorModel.inertia`;
    gyroscopic coupling neglected), mixed with the thrust by :meth:`RotorModel.rotor_rpm`.

    Args:
        model: the rotors.
        thrust: (N,) N.
        rates: (N, 3) commanded body rates, rad/s.
        body_rates: (N, 3) measured body rates, rad/s, base frame.
        period: the control period in s.

    Returns:
        (N, 4) float64 rpm.
    """
    torque = np.asarray(model.inertia) * (rates - body_rates) / period
    return model.rotor_rpm(thrust, torque)


#: A Crazyflie 2.x in the X configuration. Source: gym-pybullet-drones (utiasDSL/gym-pybullet-drones),
#: ``gym_pybullet_drones/assets/cf2x.urdf``: ``<properties arm="0.0397" kf="3.16e-10" km="7.94e-12"
#: thrust2weight="2.25">``, mass 0.027 kg, rotors (``prop0_link`` ... ``prop3_link``) at (±0.028, ±0.028) m
#: (0.0397 m from the centre), drag torque signs from ``BaseAviary._physics``. Hover speed 14,476 rpm.
CF2X = RotorModel(
    mass=0.027,
    kf=3.16e-10,
    km=7.94e-12,
    rotor_xy=((0.028, 0.028), (-0.028, 0.028), (-0.028, -0.028), (0.028, -0.028)),
    spin=(-1.0, 1.0, -1.0, 1.0),
    thrust_to_weight=2.25,
)
