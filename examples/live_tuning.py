"""Steer a running AsyncRunner job over HTTP: change the learning rate and take snapshots halfway through.

    python examples/live_tuning.py                               # SAC, 2 collectors x 8 envs, 20k env steps
    python examples/live_tuning.py --total-steps 400 --envs-per-collector 4 --run-dir /tmp/live

The runner serves its control API on a free loopback port (``control_port=0``). Halfway through,
a client thread makes the requests ``curl`` would make (the script prints each ``curl`` line):
read the hyperparameters, lower the learning rate, take a snapshot, list the snapshots, read the
status. After training, the run is rolled back to the snapshot and the snapshot file is loaded with
plain ``SAC.load``. The bearer token is also in ``<run-dir>/control_token`` (mode 0600).
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback

from unilab_gym import AsyncRunner, SharedReplayBuffer
from unilab_gym.cli import HelpFormatter
from unilab_gym.sb3.vec_env import make_sb3_env

ID = "UniLab/Quadruped-v0"


def request(url: str, token: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    """One API call, as ``curl`` makes it (the line is printed); returns the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    flags = "" if body is None else f" -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
    print(f'$ curl -s -X {method} -H "Authorization: Bearer $TOKEN"{flags} {url}')
    req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {token}"})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as response:
        answer = json.loads(response.read())
    print(json.dumps(answer)[:300])
    return answer


class Halfway(BaseCallback):
    """Sets :attr:`reached` once ``num_timesteps`` passes ``at``."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.reached = at, threading.Event()

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.at:
            self.reached.set()
        return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--total-steps", type=int, default=20_000, help="env steps (transitions) to train for")
    parser.add_argument("--num-collectors", type=int, default=2, help="collector processes")
    parser.add_argument("--envs-per-collector", type=int, default=8, help="envs stepped by each collector")
    parser.add_argument("--new-learning-rate", type=float, default=1e-4, help="the learning rate set halfway through")
    parser.add_argument("--run-dir", type=Path, default=None, help="snapshots and token file (None: under runs/)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the collectors' envs")
    parser.add_argument("--collector-timeout-s", type=float, default=60.0, help="seconds a collector may stall")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    model = SAC(
        "MlpPolicy",
        make_sb3_env(ID, 1, seed=args.seed),
        learning_starts=min(1000, args.total_steps // 4),
        batch_size=64,
        ent_coef="auto_0.01",
        replay_buffer_class=SharedReplayBuffer,
        policy_kwargs=dict(net_arch=[64, 64]),
        seed=args.seed,
    )
    halfway = Halfway(args.total_steps // 2)
    answers: dict[str, Any] = {}
    with AsyncRunner(
        model,
        env_id=ID,
        num_collectors=args.num_collectors,
        envs_per_collector=args.envs_per_collector,
        replay_ratio=8 / 64,
        control_port=0,
        collector_timeout_s=args.collector_timeout_s,
        snapshot_dir=None if args.run_dir is None else str(args.run_dir),
    ) as runner:
        api, token = f"{runner.control_url}/api/v1", str(runner.control_token)
        print(f"control API at {runner.control_url} (OpenAPI schema: {runner.control_url}/docs)")

        def client() -> None:  # halfway through: what an operator would type
            halfway.reached.wait()
            answers["before"] = request(f"{api}/hyperparams", token)
            answers["after"] = request(
                f"{api}/hyperparams", token, "POST", {"name": "learning_rate", "value": args.new_learning_rate}
            )
            answers["snapshot"] = request(f"{api}/snapshots", token, "POST", {"include_replay": False})
            answers["snapshots"] = request(f"{api}/snapshots", token)
            answers["status"] = request(f"{api}/status", token)

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        runner.learn(args.total_steps, callback=halfway)
        thread.join()
        sid = answers["snapshot"]["id"]
        print("history:", json.dumps(runner.hyperparameter_history()))
        answers["restored"] = request(f"{api}/snapshots/{sid}/restore", token, "POST")
        path = runner.snapshots()[0]["path"]
    model.replay_buffer.close()
    loaded = SAC.load(path, device="cpu")  # an ordinary SB3 file
    print(f"snapshot {sid}: {path} (SAC.load: num_timesteps={loaded.num_timesteps})")
    answers["path"] = str(path)
    return answers


if __name__ == "__main__":
    main()
