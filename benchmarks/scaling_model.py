"""The scaling model of ``docs/ray.md``: what reaches one learner from 1 to 100 nodes of 48 cores, from measured inputs.

    python benchmarks/scaling_model.py                 # print the tables (markdown)
    python benchmarks/scaling_model.py --docs docs/ray.md   # also replace the tables between the page's markers

Reads ``scaling_inputs.json`` (``benchmarks/scaling_inputs.py``: every input measured, with its source) and, if
present, ``ingest_replay.json`` (``benchmarks/ingest_replay.py``: the check of the ingest column). Per row (N nodes
x 48 cores, one collector of 32 envs per core; K ingest workers, each a learner-side core), transitions per second:

- **raw**: N x 48 x the per-core collector rate (``per_core.collector_env_steps_per_s``).
- **answer size** n: today's exchange rule at the per-core rate (``Model.answer_size``); the second table takes
  the largest answer that rule sends (half a stage, 1,024 transitions) instead.
- **ingest** = K x 10^6 / c(n), c(n) in µs of CPU per transition = (ingest path per answer at size n, the
  learner thread's and Ray's I/O threads' CPU, interpolated between the measured sizes + what a real run pays per
  answer beyond that path) / n. The real-run extra is ``real_run_ingest`` (per answer, learner thread and Ray's
  threads) minus the ingest path at that run's answer size; it is what the per-answer overhead of
  ``RayCollectorPool.poll`` costs today (idle ``ray.wait`` polls, bookkeeping).
- **link**: the learner's link (``--link-gbit``, default 10) minus the weight broadcast (each node fetches each
  published version once: N x weight bytes x versions/s), over the bytes per transition at size n (the serialized
  answer's fixed part / n + per transition).
- **training**: the measured SAC gradient steps/s of one CPU learner over the replay ratio (``--replay-ratio``,
  default 1/64: SB3's SAC on 64 envs), i.e. the transitions a learner can use.

"Reaches the learner" is the minimum; the first bottleneck is the column that sets it. The last two columns drop
the training limit (a learner that trains fast enough, e.g. on a GPU) to show what comes next.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS_DIR

from unilab_gym.cli import HelpFormatter

NODES = (1, 2, 4, 8, 16, 32, 100)
CORES = 48
KS = (1, 2, 4)
ENVS_PER_COLLECTOR = 32
#: the largest answer today's exchange rule sends: half an off-policy stage of 32 envs (``STAGE_STEPS`` x 32 / 2).
BIG_ANSWER = 1024
BEGIN, END = "<!-- scaling-table: begin (benchmarks/scaling_model.py --docs) -->", "<!-- scaling-table: end -->"


def _interp(sizes: list[int], values: list[float], n: float) -> float:
    """Linear interpolation in n, extrapolated linearly past the measured sizes (cost per answer ~ a + b n)."""
    if n <= sizes[0]:
        i = 0
    elif n >= sizes[-1]:
        i = len(sizes) - 2
    else:
        i = max(j for j in range(len(sizes) - 1) if sizes[j] <= n)
    x0, x1, y0, y1 = sizes[i], sizes[i + 1], values[i], values[i + 1]
    return max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0))


class Model:
    """The model over one ``scaling_inputs.json`` (see the module docstring)."""

    def __init__(self, inputs: dict[str, Any], link_gbit: float = 10.0, replay_ratio: float = 1 / 64):
        self.inputs = inputs
        ingest = {int(k): v for k, v in inputs["ingest"].items()}
        self.sizes = sorted(ingest)
        self.path_us = [ingest[n]["cpu_us_per_answer"] + ingest[n]["io_threads_cpu_us_per_answer"] for n in self.sizes]
        self.copy_us = [ingest[n]["copy_cpu_us_per_answer"] for n in self.sizes]
        real = inputs["real_run_ingest"]
        n_real = real["answer_transitions"]
        thread_us = [ingest[n]["cpu_us_per_answer"] for n in self.sizes]
        io_us = [ingest[n]["io_threads_cpu_us_per_answer"] for n in self.sizes]
        io_real = real.get("io_threads_us_per_transition")
        #: what a real run pays per answer beyond the ingest path at its answer size (µs of CPU): its learner
        #: thread's, and Ray's I/O threads' where that run measured them (else taken as the ingest path's).
        #: (negative when the real pool pays less per answer than the measured path)
        self.extra_us = real["us_per_answer"] - _interp(self.sizes, thread_us, n_real)
        if io_real is not None:
            self.extra_us += io_real * n_real - _interp(self.sizes, io_us, n_real)
        self.per_core = inputs["per_core"]["collector_env_steps_per_s"]
        self.link_bytes_per_s = link_gbit * 1e9 / 8
        self.link_gbit = link_gbit
        self.replay_ratio = replay_ratio
        self.train_cap = inputs["training"]["grad_steps_per_cpu_s"] / replay_ratio
        bc = inputs.get("broadcast") or {}
        self.weights_bytes = next(iter(bc.values()))["weights_bytes"] if bc else 0
        self.versions_per_s = inputs.get("publish_versions_per_s") or 0.0

    def us_per_answer(self, n: float) -> float:
        """Learner CPU per answer of ``n`` transitions (ingest path + real-run extra), µs."""
        return max(_interp(self.sizes, self.copy_us, n), _interp(self.sizes, self.path_us, n) + self.extra_us)

    def us_per_transition(self, n: float) -> float:
        """Learner CPU per transition at answers of ``n`` transitions, µs."""
        return self.us_per_answer(n) / n

    def answer_size(self, big: bool) -> float:
        """Transitions per answer: today's exchange rule at the per-core rate, or :data:`BIG_ANSWER`.

        Today's rule (``unilab_gym.runtime.ray_collector``): an answer returns once ``EXCHANGE_TARGET_S`` of the
        collector's writes are staged (at least ``EXCHANGE_MIN_STEPS`` vector steps, at most half the stage), or
        after ``EXCHANGE_WAIT_S`` with what is staged.
        """
        from unilab_gym.runtime import ray_collector as rc

        if big:
            return float(BIG_ANSWER)
        floor = rc.EXCHANGE_MIN_STEPS * ENVS_PER_COLLECTOR
        cap = rc.STAGE_STEPS * ENVS_PER_COLLECTOR // 2
        target = min(max(self.per_core * getattr(rc, "EXCHANGE_TARGET_S", 0.0), floor), cap)
        return min(target, self.per_core * rc.EXCHANGE_WAIT_S)

    def row(self, nodes: int, k: int, big: bool) -> dict[str, Any]:
        """One row of the table (transitions/s per column, the bottleneck's name)."""
        wire = self.inputs["wire"]
        n = self.answer_size(big)
        raw = nodes * CORES * self.per_core
        bytes_per_transition = wire["bytes_per_transition"] + wire["fixed_bytes"] / n
        broadcast = nodes * self.weights_bytes * self.versions_per_s
        caps = {
            "collectors": raw,
            "ingest": k * 1e6 / self.us_per_transition(n),
            "link": max(0.0, self.link_bytes_per_s - broadcast) / bytes_per_transition,
            "training": self.train_cap,
        }
        first = min(caps, key=lambda name: caps[name])
        no_train = {name: v for name, v in caps.items() if name != "training"}
        next_ = min(no_train, key=lambda name: no_train[name])
        return {
            "nodes": nodes,
            "k": k,
            "collectors": nodes * CORES,
            "answer": n,
            "answers_per_s": raw / n,
            "broadcast_mb_per_s": broadcast / 1e6,
            **{f"{name}_cap": v for name, v in caps.items()},
            "reaches": caps[first],
            "bottleneck": first,
            "reaches_no_training_limit": no_train[next_],
            "bottleneck_no_training_limit": next_,
            "mb_per_s_into_learner": caps[first] * bytes_per_transition / 1e6,
        }

    def table(self, big: bool) -> str:
        """The markdown table for today's answers or full-stage answers."""
        head = (
            "| nodes x 48 | K | raw env-steps/s | answer | answers/s | ingest cap | link cap | training cap "
            "| **reaches the learner** | **first bottleneck** | without the training limit |"
        )
        lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for nodes in NODES:
            for k in KS:
                r = self.row(nodes, k, big)
                lines.append(
                    f"| {nodes} | {k} | {_si(r['collectors_cap'])} | {r['answer']:.0f} | {_si(r['answers_per_s'])} "
                    f"| {_si(r['ingest_cap'])} | {_si(r['link_cap'])} | {_si(r['training_cap'])} "
                    f"| **{_si(r['reaches'])}** | **{r['bottleneck']}** "
                    f"| {_si(r['reaches_no_training_limit'])} ({r['bottleneck_no_training_limit']}) |"
                )
        return "\n".join(lines)

    def inputs_table(self) -> str:
        """The measured inputs, one line each, with their sources."""
        i = self.inputs
        ingest = {int(k): v for k, v in i["ingest"].items()}
        sizes = ", ".join(
            f"{n}: {v['cpu_us_per_transition']:.2f} + {v['io_threads_cpu_us_per_answer'] / n:.2f}"
            for n, v in ingest.items()
        )
        real = i["real_run_ingest"]
        t = i["training"]
        lines = [
            f"- per-core collector rate: **{self.per_core:,.0f} env-steps/s** ({i['per_core']['source']}; "
            f"the env alone {i['per_core']['env_only_env_steps_per_s']:,.0f})",
            "- ingest path, µs of learner CPU per transition by answer size (learner thread + Ray's I/O threads): "
            + sizes,
            f"- real-run extra per answer: **{self.extra_us:,.0f} µs** ({real['source']}: "
            f"{real['us_per_answer']:,.0f} µs per answer in the learner thread at "
            f"{real['answer_transitions']:.0f} transitions per answer"
            + (
                f", {real['io_threads_us_per_transition']:.1f} µs/transition in Ray's threads)"
                if real.get("io_threads_us_per_transition") is not None
                else ")"
            ),
            f"- bytes on the wire: **{i['wire']['bytes_per_transition']:.0f} B per transition + "
            f"{i['wire']['fixed_bytes']:.0f} B per answer** (a serialized answer, pickle 5 with out-of-band buffers)",
            f"- weight broadcast: **{self.weights_bytes / 1e3:,.0f} kB per version per node** at "
            f"{self.versions_per_s:.1f} versions/s (the SAC runs of {i.get('broadcast_source', '-')})",
            f"- training: **{t['grad_steps_per_cpu_s']:,.0f} SAC gradient steps per CPU second** (batch "
            f"{t['batch_size']}, {t['torch_threads']} torch thread, this CPU; {t['grad_steps_per_s']:,.0f}/s of wall "
            f"clock at the measurement's load) at replay ratio {self.replay_ratio:.4g}: {self.train_cap:,.0f} "
            "transitions/s",
            f"- learner link: {self.link_gbit:g} Gbit/s (an assumption: 10 GbE)",
        ]
        return "\n".join(lines)


def _si(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def replay_check(model: Model, replay: dict[str, Any]) -> str:
    """The simulation's achieved ingest rate next to the model's ingest column (``ingest_replay.json``)."""
    lines = [
        "| answer | K | offered (100 nodes) | model: ingest cap (K cores) | CPU the workers got | model at that CPU "
        "| replay: achieved | achieved / model at that CPU | CPU per answer: replay / model |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in replay["runs"]:
        n, k = run["answer"], run["k"]
        per_core = 1e6 / model.us_per_transition(n)
        got = run.get("cpu_obtained_cores", float(k))
        achieved = run["achieved_transitions_per_s"]
        lines.append(
            f"| {n:.0f} | {k} | {_si(run['offered_transitions_per_s'])} | {_si(k * per_core)} | {got:.2f} cores "
            f"| {_si(got * per_core)} | {_si(achieved)} | {achieved / (got * per_core):.2f}x "
            f"| {run['worker_cpu_us_per_answer']:,.0f} / {model.us_per_answer(n):,.0f} µs |"
        )
    return "\n".join(lines)


def render(inputs: dict[str, Any], replay: dict[str, Any] | None, **kwargs: Any) -> str:
    """Everything the docs show: inputs, the two tables, and the replay check if there is one."""
    model = Model(inputs, **kwargs)
    parts = [
        f"Inputs (`benchmarks/results/scaling_inputs.json`, measured {inputs['date']} at code version "
        f"`{inputs['code']}`):",
        "",
        model.inputs_table(),
        "",
        f"**Today's answers** ({model.answer_size(False):.0f} transitions: what the exchange rule sends at "
        f"{model.per_core:,.0f} env-steps/s per collector):",
        "",
        model.table(False),
        "",
        f"**Big answers** ({BIG_ANSWER} transitions: half a stage, the most today's rule sends; e.g. "
        "`EXCHANGE_MIN_STEPS = 32`):",
        "",
        model.table(True),
    ]
    if replay:
        parts += [
            "",
            f"**Check of the ingest column** (`benchmarks/ingest_replay.py`, {replay['date']}): "
            f"{replay['description']}",
            "",
            replay_check(model, replay),
        ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    parser.add_argument(
        "--inputs", default=os.path.join(RESULTS_DIR, "scaling_inputs.json"), help="measured inputs (scaling_inputs.py)"
    )
    parser.add_argument(
        "--replay",
        default=os.path.join(RESULTS_DIR, "ingest_replay.json"),
        help="the simulation's results (ingest_replay.py)",
    )
    parser.add_argument("--link-gbit", type=float, default=10.0, help="the learner's link, Gbit/s")
    parser.add_argument("--replay-ratio", type=float, default=1 / 64, help="gradient steps per transition")
    parser.add_argument(
        "--out", default=os.path.join(RESULTS_DIR, "scaling_model.md"), help="the markdown tables written"
    )
    parser.add_argument("--docs", default=None, help="a page whose scaling-table markers get the output")
    args = parser.parse_args(argv)
    with open(args.inputs) as f:
        inputs = json.load(f)
    replay = None
    if os.path.exists(args.replay):
        with open(args.replay) as f:
            replay = json.load(f)
    md = render(inputs, replay, link_gbit=args.link_gbit, replay_ratio=args.replay_ratio)
    print(md)
    with open(args.out, "w") as f:
        f.write(md)
    if args.docs:
        with open(args.docs) as f:
            page = f.read()
        if BEGIN not in page or END not in page:
            sys.exit(f"{args.docs} has no {BEGIN} ... {END} markers")
        head, rest = page.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(args.docs, "w") as f:
            f.write(head + BEGIN + "\n" + md + END + tail)
    return md


if __name__ == "__main__":
    main()
