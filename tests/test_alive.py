"""Is HRM's recurrence alive? alpha_L and alpha_H in every HRM log, analyze.py's blocks-off costs, and the two
remedies for a collapsing alpha (learn_alpha=False, scalar_lr_mult), off by default (docs/RESULTS.md section 10)."""

import json
import os
import shutil

import pytest
import torch

from conftest import HRM, last_state, raw_log, run_train


def test_learn_alpha_false_holds_alpha_as_a_buffer():
    from model import ModelConfig, build_model
    c = dict(vocab_size=50, block_size=16, n_embd=16, n_head=2, N=2, T=2)
    paper, fixed = build_model(ModelConfig(**c)), build_model(ModelConfig(**c, learn_alpha=False))
    names = {n for n, _ in paper.named_parameters()}
    assert {"L_net.alpha", "H_net.alpha", "fusion.tau"} <= names
    assert names - {n for n, _ in fixed.named_parameters()} == {"L_net.alpha", "H_net.alpha"}
    assert fixed.state_dict().keys() == paper.state_dict().keys()   # the same checkpoint keys, either way
    assert fixed.L_net.alpha.item() == fixed.H_net.alpha.item() == pytest.approx(0.1)
    for arch in ("transformer", "unitf"):
        with pytest.raises(ValueError, match=f"ModelConfig.learn_alpha: arch='{arch}' does not use learn_alpha"):
            ModelConfig(arch=arch, learn_alpha=False)
    with pytest.raises(ValueError, match="ModelConfig.learn_alpha: must be True or False"):
        ModelConfig(learn_alpha=0)


@pytest.fixture(scope="module")
def steps(data_dir, tmp_path_factory):
    """One AdamW step at a constant lr 1e-2 for the paper's setting, scalar_lr_mult=0.1 and learn_alpha=False."""
    root, out = tmp_path_factory.mktemp("alive"), {}
    for name, extra in (("paper", []), ("mult", ["--scalar_lr_mult=0.1"]), ("fixed", ["--learn_alpha=False"])):
        out[name] = str(root / name)
        run_train(HRM + ["--max_iters=1", "--eval_interval=1", "--decay_lr=False", "--learning_rate=1e-2", *extra],
                  data_dir, out[name])
    return out


def state(out_dir):
    return last_state(out_dir)["model"]


def test_log_carries_both_alphas_at_every_evaluation(steps):
    for name in steps:
        rows, sd = raw_log(steps[name]), state(steps[name])
        assert [r["iter"] for r in rows] == [0, 1]
        assert rows[0]["alpha_L"] == rows[0]["alpha_H"] == pytest.approx(0.1)
        assert rows[1]["alpha_L"] == sd["L_net.alpha"].item() and rows[1]["alpha_H"] == sd["H_net.alpha"].item()
    assert raw_log(steps["fixed"])[1]["alpha_L"] == raw_log(steps["fixed"])[1]["alpha_H"] == pytest.approx(0.1)


def test_scalar_lr_mult_scales_only_alpha_and_tau(steps):
    """AdamW's first step moves every parameter by lr * g / (|g| + eps), i.e. by its group's lr: 1e-2 for the
    norms in every run, 1e-3 for alpha_L, alpha_H and tau under scalar_lr_mult=0.1, 1e-2 in the paper's."""
    init = {"L_net.alpha": 0.1, "H_net.alpha": 0.1, "fusion.tau": 1.0}
    for name, lr in (("paper", 1e-2), ("mult", 1e-3)):
        sd = state(steps[name])
        for key, v0 in init.items():
            assert abs(sd[key].item() - v0) == pytest.approx(lr, rel=1e-3), (name, key)
        moved = (sd["fusion.norm_H.weight"] - 1).abs()   # initialised at 1, no weight decay
        assert moved.max().item() == pytest.approx(1e-2, rel=1e-3), name
    fixed = state(steps["fixed"])
    assert fixed["L_net.alpha"].item() == fixed["H_net.alpha"].item() == pytest.approx(0.1)
    assert abs(fixed["fusion.tau"].item() - 1.0) == pytest.approx(1e-2, rel=1e-3)   # tau still learns


def test_nonpositive_scalar_lr_mult_is_refused(data_dir, tmp_path):
    p = run_train(["--scalar_lr_mult=0"], data_dir, str(tmp_path / "zero"), check=False)
    assert p.returncode == 2 and "scalar_lr_mult must be > 0, got 0" in p.stderr


def test_blocks_off_costs(steps, data_dir, tmp_path, capsys):
    """analyze.py's readings against an independent computation: the checkpoint's alphas zeroed in its state
    dict and a fresh model built from it (each block off, and both)."""
    from tools import analyze
    from hrmlm.checkpoint import model_from_checkpoint
    out = tmp_path / "a.json"
    analyze.main([f"--out_dir={steps['paper']}", "--ckpt=ckpt_last.dcp", f"--data_dir={data_dir}", "--batches=2",
                  f"--json={out}"])
    text = capsys.readouterr().out
    r = json.loads(out.read_text())["alive"]
    assert r["alpha_L"] == raw_log(steps["paper"])[1]["alpha_L"] and r["alpha_H"] == raw_log(steps["paper"])[1]["alpha_H"]
    assert f"alpha_L {r['alpha_L']:.3f}, alpha_H {r['alpha_H']:.3f}" in text and "both off" in text

    ck = {k: v for k, v in last_state(steps["paper"]).items() if k != "optimizer"}   # the resume state, as one dict
    batches = analyze.val_batches(ck, data_dir, 2, 1, ck["model_args"]["block_size"])
    ce = analyze.val_ce(model_from_checkpoint(ck).eval(), batches, "cpu")
    for key, zeroed in (("off_L", ["L_net.alpha"]), ("off_H", ["H_net.alpha"]), ("off_both", ["L_net.alpha", "H_net.alpha"])):
        sd = dict(ck["model"], **{k: torch.zeros(1) for k in zeroed})
        off = analyze.val_ce(model_from_checkpoint(dict(ck, model=sd)).eval(), batches, "cpu")
        assert r[key] == pytest.approx(off - ce, abs=1e-7), key
        assert abs(off - ce) > 1e-5, key   # the blocks do something after one step (else this test tests nothing)
    model, _ = analyze.load(steps["paper"], "ckpt_last.dcp", "cpu")
    before = (model.L_net.alpha.item(), model.H_net.alpha.item())
    with analyze.blocks_off(model):
        assert model.L_net.alpha.item() == model.H_net.alpha.item() == 0
    assert (model.L_net.alpha.item(), model.H_net.alpha.item()) == before   # restored


def test_fast_only_has_no_slow_block_to_switch_off(data_dir, tmp_path, capsys):
    from tools import analyze
    out = str(tmp_path / "fo")
    run_train(HRM + ["--fast_only=True", "--max_iters=1", "--eval_interval=1"], data_dir, out)
    assert "alpha_H" not in raw_log(out)[-1] and "alpha_L" in raw_log(out)[-1]
    analyze.main([f"--out_dir={out}", "--ckpt=ckpt_last.dcp", f"--data_dir={data_dir}", "--batches=1"])
    assert "alpha_H -" in capsys.readouterr().out


# --- experiments/alive.py's selection, on made-up committed runs -----------------------------------------------------

def test_alive_selection_chooses_only_alive_runs_on_the_selection_seeds(monkeypatch, tmp_path):
    """Only runs whose blocks-off cost is at least ALIVE compete; a remedy with no alive run grows its lr grid
    downward; the best alive run and the runner-up get the second selection seed, and the lower 2-seed mean is
    chosen. Seeds 7 and 8 only: no test seed is touched."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import alive
    import runner
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    monkeypatch.setattr(alive, "REACH", 1)
    monkeypatch.setattr(alive, "HRM_START", (0, -1))
    monkeypatch.setattr(alive, "REMEDIES", {"paper": [], "fixed": ["--learn_alpha=False"]})

    def commit(remedy, k, seed, ce, off_both=None):
        d = tmp_path / runner.log_dir(alive.job("hrm-nt8", remedy, k, seed)[0])
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"diverged": False, "final_val": ce}))
        if off_both is not None:
            (d / "alive.json").write_text(json.dumps({"off_both": off_both}))

    def todo():
        return sorted((d.split(os.sep)[1], d.split(os.sep)[2]) for d, _ in alive.phase_a("hrm-nt8")
                      if not runner.finished(d))

    assert todo() == [("hrm-nt8-fixed", "lr1e-2-s7"), ("hrm-nt8-fixed", "lr5e-3-s7"), ("hrm-nt8-paper", "lr1e-2-s7"),
                      ("hrm-nt8-paper", "lr5e-3-s7")]
    commit("paper", 0, 7, 1.70, off_both=0.001)    # the best CE, switched off: never chosen
    commit("paper", -1, 7, 1.75, off_both=0.002)
    commit("fixed", 0, 7, 1.72, off_both=0.30)
    assert todo() == [("hrm-nt8-fixed", "lr5e-3-s7")]   # paper: nothing alive, but k=-2 is beyond REACH=1
    commit("fixed", -1, 7, 1.74, off_both=0.40)
    assert todo() == [("hrm-nt8-fixed", "lr2e-2-s7")]   # fixed's best alive (k=0) is at the top edge
    assert alive.top_two("hrm-nt8") == []               # not before the grid is through
    commit("fixed", 1, 7, 1.71, off_both=0.01)
    assert todo() == [] and alive.top_two("hrm-nt8") == [("fixed", 0), ("fixed", -1)]
    assert [d for d, _ in alive.phase_b("hrm-nt8")] == [alive.job("hrm-nt8", "fixed", k, 8)[0] for k in (0, -1)]
    assert alive.chosen("hrm-nt8") is None
    commit("fixed", 0, 8, 1.80)
    commit("fixed", -1, 8, 1.70)
    assert alive.chosen("hrm-nt8") == ("fixed", -1)      # 1.74 + 1.70 < 1.72 + 1.80
    test = alive.phase_c("hrm-nt8")
    assert [next(a for a in cmd if a.startswith("--seed=")) for _, cmd in test] == [f"--seed={s}" for s in alive.SEEDS]
    assert all(d.startswith(os.path.join("out-alive", "hrm-nt8-fixed", "lr5e-3-s")) and "--learn_alpha=False" in cmd
               for d, cmd in test)


def test_learn_alpha_false_holds_0_1_when_starting_from_a_learned_run(steps, data_dir, tmp_path):
    src = state(steps["paper"])["L_net.alpha"].item()
    assert abs(src - 0.1) > 1e-3
    out = str(tmp_path / "held")
    run_train(HRM + ["--max_iters=1", "--eval_interval=1", "--learn_alpha=False", f"--init_from={steps['paper']}"],
              data_dir, out)
    assert [(r["alpha_L"], r["alpha_H"]) for r in raw_log(out)] == [(pytest.approx(0.1), pytest.approx(0.1))] * 2


def test_a_resume_keeps_alpha_and_taus_own_group(steps, data_dir, tmp_path):
    """scalar_lr_mult decides AdamW's groups (alpha and tau on their own, or not): a resume keeps the checkpoint's
    (another on the command line is named in the note, not taken), and continues as the run would have."""
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = HRM + ["--eval_interval=1", "--decay_lr=False", "--learning_rate=1e-2", "--scalar_lr_mult=0.1"]
    run_train(args + ["--max_iters=2"], data_dir, ref)
    shutil.copytree(steps["mult"], out)
    p = run_train(args[:-1] + ["--max_iters=2", "--init_from=resume"], data_dir, out)
    assert "scalar_lr_mult 0.1 -> 1.0 (kept the checkpoint's)" in p.stdout, p.stdout
    assert raw_log(out)[-1]["val_loss"] == raw_log(ref)[-1]["val_loss"]


def test_next_jobs_fills_the_last_round_from_the_next_groups(monkeypatch):
    """The runner re-plans after each batch: a batch of 3 runs on 2 workers would leave a core idle beside the
    third, so the next group's first run comes along; finished runs are never planned."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import runner
    gs = [[("a", 0), ("b", 0), ("c", 0)], [("d", 0), ("e", 0)], [("f", 0)]]
    monkeypatch.setattr(runner, "finished", lambda d: d == "b")
    assert [d for d, _ in runner.next_jobs(gs, 2)] == ["a", "c"]           # a round of 2: nothing to fill
    monkeypatch.setattr(runner, "finished", lambda d: False)
    assert [d for d, _ in runner.next_jobs(gs, 2)] == ["a", "b", "c", "d"]   # e waits for the next plan
    assert [d for d, _ in runner.next_jobs(gs, 4)] == ["a", "b", "c", "d"]
    assert [d for d, _ in runner.next_jobs(gs, 5)] == ["a", "b", "c", "d", "e"]   # groups short of a round: all of them
    gs[1:] = [[("d", 0)]]
    assert [d for d, _ in runner.next_jobs(gs, 2)] == ["a", "b", "c", "d"]


def test_a_choice_that_is_section_9s_setting_is_read_on_its_reruns(monkeypatch, tmp_path, capsys):
    """Where an arm's choice is the paper's setting at section 9's lr, its test runs are section 9's committed runs
    (logs, no checkpoints): the readings come from their reruns, and the alive HRM is not tested against itself."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import alive
    import arms
    import report
    import runner
    arm, k = "hrm-nt8-d256", -2
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    monkeypatch.setattr(arms, "shown_k", lambda a: (k, True) if a == arm else (None, False))
    monkeypatch.setattr(alive, "chosen", lambda a: ("paper", k) if a == arm else None)

    def commit(out_dir, ce, reading=None):
        d = tmp_path / runner.log_dir(out_dir)
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"diverged": False, "final_val": ce, "command": f"x --seed={s}"}))
        (d / "log.jsonl").write_text(json.dumps({"iter": 2000, "val_loss": ce, "alpha_L": 0.5, "alpha_H": 0.5}) + "\n")
        if reading:
            (d / "alive.json").write_text(json.dumps(reading))

    for i, s in enumerate(arms.SEEDS):
        commit(arms.arm_job(arm, k, s)[0], 1.70 + i / 100)   # section 9's run: no checkpoint, no reading
        commit(alive.job(arm, "paper", k, s, name=f"{arm}-rerun")[0], 1.71,
               {"off_both": 1.3, "off_L": 1.2, "off_H": 0.01, "alpha_L": 0.18, "alpha_H": -0.001, "h_frozen": 0.9,
                "depth": [{"varied": "N", "ce": 2.0 + f} for f in report.DEPTHS]})
        commit(alive.phase_w()[i][0], 1.80 + 2 * i / 100)   # the width control at d=128
    assert alive.job(arm, "paper", k, arms.SEEDS[0])[0] == arms.arm_job(arm, k, arms.SEEDS[0])[0]
    alive.test_table()
    out = capsys.readouterr().out
    width = next(line for line in out.splitlines() if line.startswith(f"| {arm} (section 9) | hrm-nt8 at lr 1.25e-3 |"))
    assert "| -0.110 [-0.135, -0.085], p = 0.003 |" in width, width   # paired by seed: -0.10, -0.11, -0.12
    row = next(line for line in out.splitlines() if line.startswith(f"| {arm} |"))
    assert "0.180 ± 0.000 / -0.001 ± 0.000 | +1.200 ± 0.000, +0.010 ± 0.000, +1.300 ± 0.000 | +0.900" in row, row
    assert row.endswith("(reruns) |")
    assert "vs section 9's HRM (NT8-D256)" not in out   # the same runs: no test of a model against itself
    alive.readings_table()
    assert f"| {arm} | 3 | " in capsys.readouterr().out   # depth at inference, read on the reruns too


def test_earlier_reruns_are_the_committed_commands_in_folders_of_their_own():
    """Sections 2-7's HRM (and section 9's warmup control) is trained again for its checkpoints: each rerun must be
    its committed run's command with only out_dir changed, in a folder no other run of alive.py uses (section 10's
    2000-iteration BPE runs share testbed, variant, lr and seed with section 4's), and read."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import alive
    import arms
    import report
    import runner
    got = alive.earlier()
    assert sorted({sec for sec, *_ in got}) == ["2-5", "3", "4", "5", "6", "7"] and len(got) == 6 + 12 + 6 + 6 + 6 + 19
    for sec, v, lr, s, d, (rerun, cmd) in got:
        committed = runner.facts(d)["command"].split()[1:]
        assert cmd[1:] == [a.replace(d, rerun) for a in committed], (sec, v, s)
    reruns = [rerun for *_, (rerun, _) in got]
    for s, (rerun, cmd) in zip(alive.SEEDS, alive.phase_warm()):   # section 9's warmup control, as phase_r's arms
        committed = arms.control_job(s)[0]
        assert cmd[1:] == [a.replace(committed, rerun) for a in runner.facts(committed)["command"].split()[1:]], s
        reruns.append(rerun)
    assert len(reruns) == len(got) + 3
    commands = {}   # one command per out_dir across every phase (a phase may list another's run again, never alter it)
    for d, cmd in (j for g in alive.groups() for j in g):
        assert commands.setdefault(d, cmd) == cmd, d
    assert len(set(reruns)) == len(reruns)
    assert not {runner.log_dir(r) for r in reruns} & {runner.log_dir(d) for *_, d, _ in got}
    # every arm RESULTS compares has its alphas and blocks-off costs
    unread = [r for r in reruns if not os.path.exists(report.reading_path(r, "alive.json"))]
    assert not unread, unread


def test_a_model_without_a_slow_block_shows_a_dash_for_it(monkeypatch, tmp_path):
    """Section 3's Fast module alone has no Slow block: its readings hold None for alpha_H and its cost, and the
    tables print '-' there (a mean over None was a crash)."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import alive
    import runner
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    out_dir = os.path.join("out-alive", "s3", "char", "hrm_fast_only-post", "lr3e-3-s1337")
    d = tmp_path / runner.log_dir(out_dir)
    d.mkdir(parents=True)
    (d / "alive.json").write_text(json.dumps({"alpha_L": 0.115, "alpha_H": None, "off_L": 0.409, "off_H": None,
                                              "off_both": 0.409, "h_frozen": 0.0}))
    assert alive.alive_cells([out_dir]) == "0.115 / - | +0.409, -, +0.409 | +0.000"
