"""benchmarks/compare_sb3.py: every configuration runs and lands in all three outputs (--smoke); Ctrl-C and
SIGTERM stop the whole run with no process left; a run writes to a fresh folder, never over the committed
results unless asked; the load at the start and the end is recorded."""

import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "compare_sb3.py")

ENV = [
    "raw pybullet (physics limit)",
    "UniLabVectorEnv (1 process)",
    "AsyncRunner collectors (2 processes)",
    "AsyncRunner collectors (2 Ray actors, local)",
    "SB3 DummyVecEnv",
    "SB3 SubprocVecEnv (2 workers)",
    "gymnasium AsyncVectorEnv (2 workers)",
]
SAC = [
    "stock SB3 SAC",
    "SB3 SAC + SharedReplayBuffer",
    "AsyncRunner SAC (2 collectors)",
    "AsyncRunner SAC (2 Ray actors, local)",
]
PPO = [
    "stock SB3 PPO (1 process)",
    "stock SB3 PPO (SubprocVecEnv)",
    "AsyncRunner PPO (lag 0)",
    "AsyncRunner PPO (lag 1)",
]
REPLAY = ["sb3", "shared", "tianshou"]
#: Tianshou's VectorReplayBuffer compiles two numba functions in every new process (~5 s on 2 cores); the replay
#: section's smoke-sized figures mean nothing anyway, so these runs use it as plain Python (tests/tianshou/: numba).
NO_JIT = {**os.environ, "NUMBA_DISABLE_JIT": "1"}


@pytest.mark.timeout(600)
def test_smoke_mode_writes_every_configuration(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "compare_sb3.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=NO_JIT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "compare_sb3.json").read_text())
    assert {"cpu", "cores", "ram_gb", "versions"} <= set(report["machine"])
    assert report["machine"]["versions"]["pybullet"]
    sections = report["sections"]
    assert list(sections["env"]["runs"]) == ENV
    assert list(sections["sac"]["runs"]) == SAC
    assert list(sections["ppo"]["runs"]) == PPO
    assert list(sections["replay"]["results"]) == REPLAY
    for section in ("env", "sac", "ppo"):
        for name, runs in sections[section]["runs"].items():
            assert runs and all(r["env_steps_per_s"] > 0 for r in runs), name
    for name in SAC:
        assert sections["sac"]["runs"][name][0]["grad_steps"] > 0
    for name in PPO:  # every PPO configuration trained on all the env steps
        run = sections["ppo"]["runs"][name][0]
        assert run["grad_steps"] > 0 and run["env_steps"] >= report["config"]["rl_steps"]
    table = (tmp_path / "compare_sb3.md").read_text()
    for name in ENV + SAC + PPO + REPLAY:
        assert f"| {name} |" in table, name
    png = (tmp_path / "compare_sb3.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "target, sig, code, configuration",
    [
        ("group", signal.SIGINT, 130, 1),  # Ctrl-C in a terminal: the whole foreground group
        ("group", signal.SIGTERM, 143, 1),
        ("parent", signal.SIGTERM, 143, 1),  # kill PID: the configuration process must not outlive it
        ("parent", signal.SIGTERM, 143, 3),  # the AsyncRunner collectors configuration: grandchildren
        ("parent", signal.SIGINT, 130, 1),
    ],
)
def test_an_interrupt_stops_the_whole_run_and_leaves_no_process(tmp_path, target, sig, code, configuration):
    stderr = open(tmp_path / "stderr", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--only", "env", "--num-envs", "8"],  # default mode: every run in its own process
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,  # its own process group, as a shell job
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        started = []
        for line in proc.stdout:  # each configuration process prints its pid as it starts
            if m := re.search(r"\(pid (\d+)\)$", line.strip()):
                started.append(int(m.group(1)))
                if len(started) == configuration:
                    break
        assert len(started) == configuration, "the run ended before its configuration processes started"
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stderr.close()
    assert proc.returncode == code, (tmp_path / "stderr").read_text()[-3000:]
    assert "(pid " not in rest, "the run went on to the next configuration"
    assert "nothing written" in (tmp_path / "stderr").read_text()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in started)
    # multiprocessing's resource tracker exits on its own once the run's end closes its pipe: give it that moment
    _, alive = psutil.wait_procs(_group_members(proc.pid), timeout=10)
    assert not alive, f"a process of the run outlived it: {[p.cmdline() for p in alive]}"
    assert not list(tmp_path.rglob("compare_sb3.json"))
    assert not list((tmp_path / "runs" / "compare_sb3").iterdir())  # no empty run folder left behind


@pytest.mark.timeout(300)
def test_a_run_writes_a_fresh_folder_and_records_the_load(tmp_path):
    committed = os.path.join(ROOT, "benchmarks", "results", "compare_sb3.json")
    before = os.stat(committed).st_mtime_ns if os.path.exists(committed) else None
    out = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--only", "replay"],  # the lightest section
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=NO_JIT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path = re.search(r"results go to (\S+)", out.stdout).group(1)
    assert re.fullmatch(r"runs/compare_sb3/\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", path), path
    assert f"wrote {path}/compare_sb3.{{md,json,png}}" in out.stdout
    assert (os.stat(committed).st_mtime_ns if os.path.exists(committed) else None) == before
    report = json.loads((tmp_path / path / "compare_sb3.json").read_text())
    load = report["load"]
    for when in ("start", "end"):
        s = load[when]
        assert s["cores"] > 0 and len(s["load_average"]) == 3
        assert 0 <= s["busy_cores"] <= os.cpu_count() and s["available_cores"] == max(0.0, s["cores"] - s["busy_cores"])
    assert load["busy"] == (load["warning"] is not None)
    table = (tmp_path / path / "compare_sb3.md").read_text()
    assert (load["warning"] or "Load: idle machine") in table
    if load["warning"]:  # printed after the tables too
        assert out.stdout.rstrip().splitlines()[-2] == load["warning"]


def _benchmarks_module(name: str):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_every_run_gets_its_own_folder(tmp_path):
    fresh_run_dir = _benchmarks_module("compare_sb3").fresh_run_dir
    first, second = fresh_run_dir(str(tmp_path)), fresh_run_dir(str(tmp_path))
    assert second != first and os.path.dirname(second) == str(tmp_path)
    assert os.listdir(first) == os.listdir(second) == []


def test_a_busy_machine_gets_a_warning_next_to_the_table():
    busy_warning = _benchmarks_module("common").busy_warning
    _load_line = _benchmarks_module("compare_sb3")._load_line
    idle = {"cores": 2.0, "busy_cores": 0.05, "load_average": [0.3, 0.5, 0.6], "available_cores": 1.95}
    busy = {**idle, "busy_cores": 1.6, "available_cores": 0.4}
    assert busy_warning(idle, idle) is None
    assert "Load: idle machine" in _load_line({"warning": None, "start": idle, "end": idle})
    for start, end in ((busy, idle), (idle, busy), ({**idle, "load_average": [4.5, 3.0, 2.0]}, idle)):
        warning = busy_warning(start, end)
        assert warning.startswith("WARNING: the machine was busy") and "multi-process" in warning
        assert _load_line({"warning": warning, "start": start, "end": end}) == f"> **{warning}**"
