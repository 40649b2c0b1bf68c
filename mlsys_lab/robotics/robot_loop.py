"""The perception → planning → control loop of a differential-drive robot, on the runtime.

Five nodes on one :class:`~.runtime.Runtime` (so on the cluster simulator's event loop and
clock), in the shape of a ROS 2 navigation stack:

=============== ============================================================================
``sensor``      a timer at ``sensor_hz``: measures range and bearing to the landmarks in
                range from the robot's true pose; publishes ``scan`` (stamped now)
``perception``  ``scan`` (KEEP_LAST ``scan_depth``) → one EKF update per landmark (cost: the
                ``cost`` parameter, which :func:`run_loop`'s ``load`` raises mid-run) →
                ``pose`` (the scan's stamp passed on); ``cmd_vel`` (depth 1) → odometry
``planner``     service ``plan``: A* on the occupancy grid from a cell to a cell (cost
                ``plan_cost``); returns the waypoints in metres
``controller``  asks ``plan`` once at start; ``pose`` (depth 1) → pure pursuit → ``cmd_vel``
``base``        ``cmd_vel`` (depth 1) → applies the command to the plant; the *end-to-end
                latency* is actuation time minus the scan's stamp, a *deadline miss* one
                over ``deadline``
=============== ============================================================================

The plant (the true robot) moves in simulated time: before anything reads or changes its
state it is integrated from its last time to now with the command it holds (zero-order hold).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dynamics import DiffDrive
from .ekf import EKF, measure
from .planning import astar, pure_pursuit
from .runtime import Runtime

__all__ = ["LoopResult", "Plant", "default_world", "run_loop"]


class Plant:
    """The true robot: pose and held command, integrated lazily to the time asked for."""

    def __init__(self, pose, dt=0.01):
        self.robot, self.pose, self.u = DiffDrive(), np.asarray(pose, float).copy(), np.zeros(2)
        self.t, self.dt = 0.0, dt
        self.path = [(0.0, *self.pose)]

    def advance(self, t):
        while self.t < t - 1e-12:
            h = min(self.dt, t - self.t)
            self.pose = self.robot.step(self.pose, self.u, h)
            self.t += h
        self.path.append((self.t, *self.pose))
        return self.pose


def default_world(seed=0):
    """A 30 × 30 occupancy grid of 0.25 m cells (7.5 m square) with walls and clutter, five
    landmarks, start and goal cells."""
    rng = np.random.default_rng(seed)
    grid = rng.random((30, 30)) < 0.06
    grid[8, 0:20] = True
    grid[18, 10:30] = True
    start, goal = (2, 2), (27, 27)
    for r, c in (start, goal):
        grid[max(0, r - 1):r + 2, max(0, c - 1):c + 2] = False
    landmarks = np.array([[1.0, 6.5], [6.5, 1.0], [4.0, 4.0], [6.5, 6.5], [1.0, 1.0]])
    return grid, start, goal, landmarks


@dataclass
class LoopResult:
    """What a run measured: ``latency`` (end-to-end, per actuation), ``actuated_at``,
    ``deadline_misses``, ``drops`` (per subscription ``node/topic``), ``spans`` (the
    timeline), ``path`` (true poses ``(t, x, y, θ)``), ``estimate`` (EKF poses),
    ``waypoints``, ``reached`` (within 0.3 m of the goal), ``runtime``."""

    latency: np.ndarray
    actuated_at: np.ndarray
    deadline_misses: int
    drops: dict
    spans: list
    path: np.ndarray
    estimate: np.ndarray
    waypoints: np.ndarray
    reached: bool
    runtime: Runtime


def run_loop(duration=30.0, sensor_hz=20.0, perception_cost=0.01, load=None, scan_depth=1,
             plan_cost=0.02, control_cost=0.002, deadline=0.1, seed=0, alpha=2e-4,
             beta=1 / 1e8, cell=0.25, speed=0.6):
    """Run the loop for ``duration`` simulated seconds.

    Args:
        load: ``(t, cost)``: at time ``t`` the perception callback's cost becomes ``cost``
            seconds (a heavier model, a busier CPU).
        scan_depth: KEEP_LAST depth of the perception node's ``scan`` subscription.

    Returns:
        :class:`LoopResult`.
    """
    grid, start, goal, landmarks = default_world(seed)
    rng = np.random.default_rng(seed + 1)
    to_xy = lambda rc: np.array([rc[1] + 0.5, rc[0] + 0.5]) * cell  # noqa: E731
    plant = Plant([*to_xy(start), 0.0])
    rt = Runtime(alpha=alpha, beta=beta)
    sensor, perception, planner = (rt.create_node(n) for n in ("sensor", "perception",
                                                               "planner"))
    controller, base = rt.create_node("controller"), rt.create_node("base")
    meas_std = np.array([0.05, 0.02])
    ekf = EKF(plant.pose, np.diag([1e-3, 1e-3, 1e-3]), odom_std=(0.05, 0.05),
              meas_std=meas_std)
    state = dict(odom=np.zeros(2), odom_t=0.0, waypoints=None, progress=0, estimates=[])
    latency, actuated = [], []

    # sensor: a timer measuring the landmarks in range (6 m)
    def scan():
        pose = plant.advance(rt.now())
        z = [(i, measure(pose, lm) + rng.standard_normal(2) * meas_std)
             for i, lm in enumerate(landmarks) if measure(pose, lm)[0] < 6.0]
        sensor.publish("scan", z, nbytes=16 * len(z) + 16)
    sensor.create_timer(1.0 / sensor_hz, scan, cost=0.001)

    # perception: EKF predict with the last odometry, update with the scan
    perception.declare_parameter("cost", perception_cost)

    def on_scan(msg):
        now = rt.now()
        ekf.predict(state["odom"], now - state["odom_t"])
        state["odom_t"] = now
        for i, z in msg.data:
            ekf.update(z, landmarks[i])
        state["estimates"].append((now, *ekf.x))
        perception.publish("pose", ekf.x.copy(), stamp=msg.stamp)

    def on_odom(msg):
        now = rt.now()
        ekf.predict(state["odom"], now - state["odom_t"])
        state["odom"], state["odom_t"] = np.asarray(msg.data, float), now
    perception.create_subscription("scan", on_scan, depth=scan_depth,
                                   cost=lambda msg: perception.get_parameter("cost"))
    perception.create_subscription("cmd_vel", on_odom, depth=1, cost=0.0005)

    # planner: A* as a service
    def plan(request):
        a, b = request
        res = astar(grid, a, b)
        return None if res.path is None else np.array([to_xy(c) for c in res.path])
    planner.create_service("plan", plan, cost=plan_cost)

    # controller: plan once, then pure pursuit on every pose estimate
    def got_plan(future):
        state["waypoints"] = future.result()
    rt.at(0.01, lambda: controller.call_async("plan", (start, goal), callback=got_plan))

    def on_pose(msg):
        pts = state["waypoints"]
        if pts is None:
            return
        pose = msg.data
        if np.hypot(*(pts[-1] - pose[:2])) < 0.15:
            v, w = 0.0, 0.0
        else:
            v, w, state["progress"] = pure_pursuit(pose, pts, state["progress"], speed, 0.5,
                                                   1.0 / sensor_hz)
        controller.publish("cmd_vel", np.array([v, w]), stamp=msg.stamp)
    controller.create_subscription("pose", on_pose, depth=1, cost=control_cost)

    # base: actuate
    def on_cmd(msg):
        now = rt.now()
        plant.advance(now)
        plant.u = np.asarray(msg.data, float)
        latency.append(now - msg.stamp)
        actuated.append(now)
    base.create_subscription("cmd_vel", on_cmd, depth=1, cost=0.0005)

    if load is not None:
        t_load, cost = load
        rt.at(t_load, lambda: perception.set_parameter("cost", cost))
    rt.run(duration)
    plant.advance(duration)
    lat = np.array(latency)
    drops = {f"{sub.node.name}/{sub.topic}": sub.dropped for n in rt.nodes
             for sub in n.subscriptions}
    path = np.array(plant.path)
    pts = state["waypoints"]
    reached = pts is not None and bool(np.hypot(*(path[-1, 1:3] - pts[-1])) < 0.3)
    return LoopResult(lat, np.array(actuated), int((lat > deadline).sum()), drops, rt.spans,
                      path, np.array(state["estimates"]), pts, reached, rt)
