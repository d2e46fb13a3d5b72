"""Load a saved SB3 model (SAC, PPO, TD3, DDPG, A2C) and write a video of env 0 of UniLab/Quadruped-v0.

    python examples/play.py runs/sac_sb3/model.zip                      # -> runs/sac_sb3/model.mp4
    python examples/play.py runs/ppo_sb3/model.zip --out ppo.gif --steps 250

The same as ``unilab-gym play``: see :mod:`unilab_gym.cli.play` for the options.
"""

from unilab_gym.cli.play import main

if __name__ == "__main__":
    main()
