"""The transport between collectors and the learner, free of any RL framework.

Collector pools (process, Ray, inline), the collectors, weight broadcast, the rollout and counter segments,
the pipeline metrics and the collector errors. The SB3 learner side (``AsyncRunner`` and its loops) lives in
:mod:`unilab_gym.sb3`.
"""
