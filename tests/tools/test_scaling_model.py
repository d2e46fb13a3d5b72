"""benchmarks/scaling_model.py (issue 30, item 4): the docs' scaling table is the model's output on the committed
inputs, each row names the column that sets it, and the ingest column follows the measured costs."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
    import scaling_model
finally:
    sys.path.pop(0)


@pytest.fixture(scope="module")
def inputs():
    with open(os.path.join(RESULTS, "scaling_inputs.json")) as f:
        return json.load(f)


def test_the_docs_table_is_the_models_output_on_the_committed_inputs(inputs):
    with open(os.path.join(RESULTS, "ingest_replay.json")) as f:
        replay = json.load(f)
    with open(os.path.join(ROOT, "docs", "ray.md")) as f:
        page = f.read()
    between = page.split(scaling_model.BEGIN, 1)[1].split(scaling_model.END, 1)[0]
    assert between.strip() == scaling_model.render(inputs, replay).strip(), (
        "docs/ray.md's scaling table is stale: python benchmarks/scaling_model.py --docs docs/ray.md"
    )


@pytest.mark.parametrize("big", [False, True])
def test_every_row_reaches_its_smallest_cap_and_names_it(inputs, big):
    model = scaling_model.Model(inputs)
    rows = [model.row(n, k, big) for n in scaling_model.NODES for k in scaling_model.KS]
    assert {(r["nodes"], r["k"]) for r in rows} == {(n, k) for n in (1, 2, 4, 8, 16, 32, 100) for k in (1, 2, 4)}
    for r in rows:
        caps = {name: r[f"{name}_cap"] for name in ("collectors", "ingest", "link", "training")}
        assert r["reaches"] == min(caps.values()) == caps[r["bottleneck"]]
        others = {name: v for name, v in caps.items() if name != "training"}
        assert r["reaches_no_training_limit"] == caps[r["bottleneck_no_training_limit"]] == min(others.values())
        assert r["collectors_cap"] == pytest.approx(r["nodes"] * 48 * model.per_core)


def test_the_ingest_column_follows_the_measured_cost_per_answer(inputs):
    model = scaling_model.Model(inputs)
    one, two = model.row(4, 1, True), model.row(4, 2, True)
    assert two["ingest_cap"] == pytest.approx(2 * one["ingest_cap"])
    measured = inputs["ingest"]["1024"]
    per_answer = measured["cpu_us_per_answer"] + measured["io_threads_cpu_us_per_answer"] + model.extra_us
    assert one["answer"] == 1024 and one["ingest_cap"] == pytest.approx(1024 * 1e6 / per_answer)
    # slower answers cost more per transition: the cap falls with the answer size
    assert model.us_per_transition(64) > model.us_per_transition(512) > model.us_per_transition(4096)


def test_more_weight_broadcast_leaves_less_of_the_link_for_data(inputs):
    model = scaling_model.Model(inputs)
    assert model.row(100, 1, True)["link_cap"] < model.row(1, 1, True)["link_cap"]
    model.versions_per_s = 0.0
    assert model.row(100, 1, True)["link_cap"] == pytest.approx(model.row(1, 1, True)["link_cap"])
