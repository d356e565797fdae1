"""Runs on a real Slurm cluster started by the tests on this machine (tests/slurm_cluster.py: munged, slurmctld and two
slurmd, CPU ranks on gloo). Every cluster test is in this one module: pytest-xdist hands a whole module to one
worker, so the suite starts one cluster, once.

One run is submitted, stopped, resumed, requeued and completed (its losses equal a 2-process run on this machine);
another fails at its start; every bad input is refused before anything is submitted; the browser test submits from
the Train tab and follows the run until it is killed with `scancel --full`. Without Slurm's programs the tests skip,
unless FINETUNE_TESTS_NEED_SLURM=1 (CI), where they fail."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.cluster import scheduler, slurm
from finetune.errors import UserError
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from finetune.studio import Studio
from tests.helpers import cli, losses, tiny_config
from tests.slurm_cluster import SlurmCluster, missing_programs

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 300  # a ceiling for a hung job on a busy 2-core machine, never a measurement
HOLD = ROOT / "tests" / "slurm_hold"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The module's Slurm cluster; SLURM_CONF and the hold's PYTHONPATH in the environment the jobs inherit."""
    missing = missing_programs()
    if missing:
        reason = f"Slurm is not installed here (no {', '.join(missing)}); apt-get install slurm-wlm munge"
        if os.environ.get("FINETUNE_TESTS_NEED_SLURM") == "1":
            pytest.fail(reason + " (FINETUNE_TESTS_NEED_SLURM=1)")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    running = SlurmCluster(folder).start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLURM_CONF", str(running.conf))
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HOLD), str(ROOT), os.environ.get("PYTHONPATH")])))
        env.setenv("OMP_NUM_THREADS", "1")  # two ranks share this machine's two cores
        env.delenv("FINETUNE_TEST_HOLD", raising=False)
        yield running
    running.stop()


def wait_for(condition, what: str, timeout: float = JOB_TIMEOUT_S) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.3)


def shown(run: Path) -> dict:
    """The run as the app lists it (the runs list merges Slurm's word with the run's files)."""
    scheduler._CACHE.clear()  # the app asks Slurm at most every 2 s; a test wants the answer of now
    return next(r for r in RunManager(run.parent).runs() if r["run_dir"] == str(run))


def job_of(run: Path) -> str:
    return str(scheduler.read_job(run)["job_id"])


def job_gone(cluster: SlurmCluster, job: str) -> bool:
    state = cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()
    return state in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def hold(monkeypatch, step: int, marker: Path) -> Path:
    """The next submitted job holds every rank at the end of `step` (tests/slurm_hold/sitecustomize.py)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("FINETUNE_TEST_HOLD", f"{step}:{marker}")
    return marker


def slurm_config(model_dir: Path, **overrides):
    values = {"runs_on": "slurm", "nodes": 2, "gpus_per_node": 0, "max_steps": 6, "save_steps": 2, "eval_steps": 100}
    return tiny_config(model_dir, **{**values, **overrides})


# --------------------------------------------------------------------------- bad input, before anything is submitted
def test_each_bad_input_is_one_line_naming_the_field_and_nothing_is_submitted(cluster, tiny_model_dir, studio_home):
    runs = studio_home / "runs"
    cases = [
        ({"slurm_partition": "gpu"}, "slurm_partition: 'gpu' is not a partition of this cluster (it has: debug)"),
        ({"gpus_per_node": 4}, "gpus_per_node: 4 GPUs per node asked, but the nodes of the default partition have at "
                               "most 0"),
        ({"nodes": 3}, "nodes: 3 nodes asked, but the default partition has 2"),
    ]  # fmt: skip
    for overrides, line in cases:
        with pytest.raises(UserError) as caught:
            slurm.submit(slurm_config(tiny_model_dir, **overrides), runs)
        assert str(caught.value).startswith(line), caught.value
    # A run folder only this machine sees: refused, and the folder made for the check is gone again.
    hidden = cluster.hidden / "runs"
    with pytest.raises(UserError, match=r"^output_dir: .*hidden/runs is not seen by every node of the cluster"):
        slurm.submit(slurm_config(tiny_model_dir), hidden)
    assert not hidden.exists() or not any(hidden.iterdir())
    # The command line says the same, in one line, exit 2.
    config = studio_home / "run.yaml"
    slurm_config(tiny_model_dir).save(config)
    assert main(["submit", "--config", str(config), "--slurm", "--partition", "nope"]) == 2
    # Nothing was submitted (the run-folder check's own short `finetune-check` job may still be completing).
    queued = cluster.run(["squeue", "-h", "-o", "%j"]).stdout.split()
    assert [name for name in queued if name != "finetune-check"] == [], queued
    assert not runs.exists() or not any(runs.iterdir())


# --------------------------------------------------------------------------- one run: stop, resume, requeue, complete
def test_a_two_node_run_stops_resumes_is_requeued_and_completes_with_the_losses_of_a_local_run(
    cluster, tiny_model_dir, studio_home, monkeypatch, capsys
):
    runs = studio_home / "runs"
    config = studio_home / "run.yaml"
    slurm_config(tiny_model_dir).save(config)
    first = hold(monkeypatch, 2, studio_home / "held-2")
    assert main(["submit", "--config", str(config), "--slurm", "--nodes", "2", "--gpus-per-node", "0"]) == 0
    out = capsys.readouterr().out
    run = Path(out.strip().splitlines()[-1])
    job = job_of(run)
    assert f"# Slurm job {job};" in out
    # The reference: the same config on two processes of this machine, launched now (it trains while the job waits).
    local = cli("launch", "--config", str(config), "--set", "runs_on=this_machine", "--nproc", "2", home=studio_home)
    assert local.returncode == 0, local.stderr[-2000:]
    local_run = Path(local.stdout.strip().splitlines()[-1])
    script = (run / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --signal=B:USR1@" in script and "#SBATCH --requeue" in script

    # Held at step 2 on both nodes: it is running; a second submission for the run is refused, naming the job.
    wait_for(lambda: Path(f"{first}.rank0").exists() and Path(f"{first}.rank1").exists(), "both ranks at step 2")
    assert shown(run)["status"] == "running"
    with pytest.raises(UserError, match=rf"already has Slurm job {job} \(running\); stop it first"):
        slurm.resume(run, runs)

    # Stop: USR1 to the batch script, which raises the stop flag; every rank ends the step, checkpoints, stops.
    studio = Studio(runs)
    assert studio.stop(run.name)
    assert f"Slurm job {job}: every rank finishes its step" in studio.stop_words()
    wait_for((run / "stop-requested").exists, "the batch script's trap to raise the stop flag")
    Path(f"{first}.release").write_text("")
    wait_for(lambda: job_gone(cluster, job), "the stopped job to end")
    state = shown(run)
    assert (state["status"], state["step"], state["resumable"]) == ("stopped", 2, True)
    assert RunDir(run).last_checkpoint().name == "checkpoint-2"

    # Resume: a new job continuing at step 3; held at step 5 (after checkpoint-4), then requeued as a preemption
    # would, it continues from checkpoint-4 by itself and completes.
    second = hold(monkeypatch, 5, studio_home / "held-5")
    assert main(["submit", "--resume", str(run)]) == 0
    resumed = job_of(run)
    assert resumed != job
    wait_for(lambda: Path(f"{second}.rank0").exists(), "the resumed job at step 5")
    cluster.run(["scontrol", "requeue", resumed])
    wait_for(lambda: shown(run)["status"] == "pending", "the requeued job to wait in the queue")
    assert "requeued" in shown(run)["message"]

    def started_now() -> bool:
        """A requeued job waits 120 s before it may start again; asked to start now until it has (a job still being
        requeued does not take the new start time)."""
        cluster.run(["scontrol", "update", f"JobId={resumed}", "StartTime=now"], check=False)
        return shown(run)["status"] != "pending"

    wait_for(started_now, "the requeued job to start again")
    wait_for(lambda: job_gone(cluster, resumed), "the requeued job to end")
    final = shown(run)
    assert (final["status"], final["step"]) == ("completed", 6), final
    resumes = [(e["step"], e["checkpoint"]) for e in RunDir(run).read_events(("resume",))]
    assert resumes == [(2, "checkpoint-2"), (4, "checkpoint-4")]
    assert "restart 1" in (run / "slurm.log").read_text()  # the requeued start of the same job

    # The same run on two processes of this machine (trained meanwhile) has the same losses, step by step.
    wait_for(lambda: RunDir(local_run).effective_status() == "completed", "the local 2-process run")
    on_slurm, here = losses(run), losses(local_run)
    assert [s for s, _ in on_slurm] == [1, 2, 3, 4, 5, 6] == [s for s, _ in here]
    assert [round(v, 4) for _, v in on_slurm] == [round(v, 4) for _, v in here]


# --------------------------------------------------------------------------- a job that fails at its start
def test_a_job_that_fails_before_training_is_failed_with_its_log_line(cluster, tiny_model_dir, studio_home):
    runs = studio_home / "runs"
    done = slurm.submit(slurm_config(tiny_model_dir, slurm_extra="--hold"), runs)  # waits for our release
    assert shown(done.run.path)["status"] == "pending"
    assert "waits in the queue" in shown(done.run.path)["message"]
    (done.run.path / "config.yaml").write_text("max_steps: [not, a, number\n")  # damaged while it waited
    cluster.run(["scontrol", "release", done.job_id])
    wait_for(lambda: job_gone(cluster, done.job_id), "the job to fail")
    state = shown(done.run.path)
    assert state["status"] == "failed"
    assert state["error"].startswith(f"Slurm job {done.job_id} ended (FAILED): error: config: not valid YAML")


# --------------------------------------------------------------------------- the app, in a browser
@pytest.mark.browser
def test_the_train_tab_submits_a_two_node_run_follows_it_and_shows_it_interrupted_after_scancel(
    cluster, tiny_model_dir, studio_home, monkeypatch
):
    from tests.test_ui_support import CHROMIUM, app_page, browser_expect

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="pip package playwright is not installed")
    from finetune.engines.world import free_port
    from tests.helpers import mini_dataset
    from ui.app import build_app, launch

    expect = browser_expect()
    studio = Studio(studio_home / "runs")
    demo = build_app(studio)
    port = free_port()
    launch(demo, port=port, block=False, quiet=True)
    marker = hold(monkeypatch, 2, studio_home / "held-browser")  # the job inherits the app's environment
    try:
        with app_page(f"http://127.0.0.1:{port}", viewport={"width": 1280, "height": 900}) as page:
            page.get_by_role("tab", name="Configure", exact=True).click()
            for group in ("Optimisation", "Output", "Where it runs"):
                page.locator(f"#cfg-group-{group.lower().replace(' ', '-')}").get_by_text(
                    group, exact=True
                ).first.click()
            for field, value in (
                ("model", tiny_model_dir), ("dataset", mini_dataset()), ("eval_split", ""), ("max_steps", 4),
                ("max_seq_length", 64), ("save_steps", 1), ("nodes", 2), ("gpus_per_node", 0),
            ):  # fmt: skip
                box = page.locator(f"#cfg-{field}").locator("input, textarea").first
                box.fill(str(value))
                box.press("Tab")
                expect(box).to_have_value(str(value))
            page.get_by_role("tab", name="Train", exact=True).click()
            expect(page.locator("#train-plan")).to_contain_text("on this machine's CPU")  # read for the tab
            page.locator("#train-where").get_by_text("A Slurm cluster", exact=True).click()
            expect(page.locator("#train-plan")).to_contain_text("Slurm cluster: 2 nodes × their CPUs")
            page.locator("#train-show-script").click()
            expect(page.locator("#train-script")).to_contain_text("#SBATCH --nodes=2")
            expect(page.locator("#train-script-file")).to_be_visible()
            expect(page.locator("#train-message")).to_contain_text("Start submits this script as shown")
            with page.expect_download() as download:
                page.locator("#train-script-file a").first.click()
            shown_before = Path(download.value.path()).read_text(encoding="utf-8")

            page.locator("#train-start").click()
            expect(page.locator("#train-message")).to_contain_text("Submitted run")
            run = next(iter((studio_home / "runs").iterdir()))
            job = job_of(run)
            submitted = (run / "slurm.sbatch").read_text()
            expect(page.locator("#train-script")).to_contain_text(f"#SBATCH --output={run}/slurm.log")
            assert submitted == shown_before  # what was shown and downloaded before Start is what sbatch got
            progress = page.locator("#train-progress .fs-progress")
            expect(progress).to_have_attribute("data-step", "2", timeout=JOB_TIMEOUT_S * 1000)
            expect(progress).to_have_attribute("data-status", "running")
            log = page.locator("#train-job-log textarea")
            expect(log).to_have_value(re.compile(re.escape(f"job {job} (restart 0) on node[1-2]")))
            expect(page.locator("#train-plot")).to_be_visible()

            page.locator("#train-stop").click()  # the first Stop: USR1 to the batch script, which raises the flag
            expect(page.locator("#train-message")).to_contain_text(f"Slurm job {job}: every rank finishes its step")
            wait_for((run / "stop-requested").exists, "the stop flag")
            cluster.run(["scancel", "--full", job])  # killed before it could checkpoint and stop
            expect(progress).to_have_attribute("data-status", "interrupted", timeout=JOB_TIMEOUT_S * 1000)
            expect(page.locator("#train-runs-table")).to_contain_text("Interrupted (its processes ended")
            expect(page.locator("#train-resume")).to_be_enabled()
            assert shown(run)["resumable"] and submitted == (run / "slurm.sbatch").read_text()
    finally:
        Path(f"{marker}.release").write_text("")
        demo.close()
