"""plot.py and analyze.py on tiny checkpoints made here; plot.py's log reader."""

import json
import os

import pytest

from hrmlm.signals import UserError
from conftest import char_tiny, one_error_line, raw_log, run_script, run_train

HRM_NT6 = ["--arch=hrm", "--N=2", "--T=3", "--K=2", "--max_iters=6", "--eval_interval=3"]


@pytest.fixture(scope="session")
def runs(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    hrm, tf = str(root / "hrm"), str(root / "tf")
    run_train(HRM_NT6, data_dir, hrm)
    run_train(["--arch=transformer", "--n_layer=2", "--max_iters=6", "--eval_interval=3"], data_dir, tf)
    return hrm, tf


def test_plot_writes_png(runs, tmp_path):
    from tools import plot
    out = tmp_path / "curves.png"
    plot.main([*runs, f"--out={out}", "--title=t", "--labels=HRM,T-L2"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(UserError, match="log.jsonl not found"):
        plot.main([str(tmp_path / "nothing"), f"--out={out}"])
    with pytest.raises(UserError, match="1 labels for 2 runs"):
        plot.main([*runs, "--labels=one"])


def test_analyze_tables_and_json(runs, data_dir, tmp_path, capsys):
    from tools import analyze
    hrm, _ = runs
    out = tmp_path / "a.json"
    analyze.main([f"--out_dir={hrm}", f"--data_dir={data_dir}", "--batches=2", f"--json={out}"])
    text = capsys.readouterr().out
    assert "HLRole(A)" in text and "HLRole(B-C)" in text and "mean output-fusion weights" in text
    r = json.loads(out.read_text())
    assert [s["step"] for s in r["steps"]] == [1, 2, 3, 4, 5, 6]
    assert [s["h_fired"] for s in r["steps"]] == [False, False, True, False, False, True]
    for s in r["steps"]:
        assert 0 < s["gate"] < 1 and -1 <= s["cos_zH_zL"] <= 1
        if not s["h_fired"]:   # z_H only changes on the steps where the Slow module fires
            assert s["z_H_norm_before"] == s["z_H_norm_after"]
    assert r["steps"][2]["z_H_norm_after"] != r["steps"][2]["z_H_norm_before"]
    assert r["delta_ce"] == pytest.approx(r["ce_h_frozen"] - r["ce"]) and r["ce_h_frozen"] != r["ce"]
    assert sum(r["fusion"].values()) == pytest.approx(1.0, abs=1e-5)
    # the CE it reports is the final-pass CE train.py logged for the same weights (other batches: close)
    assert abs(r["ce"] - raw_log(hrm)[-1]["val_loss"]) < 1.0


def test_frozen_slow_module_keeps_z_H0(runs, data_dir):
    import torch
    from tools import analyze
    model, ck = analyze.load(runs[0], "ckpt.pt", "cpu")
    with analyze.slow_module_frozen(model), analyze.record_steps(model) as steps:
        model(torch.zeros((1, 8), dtype=torch.long))
    assert len(steps) == model.config.M and sum(fired for _, fired, *_ in steps) == model.config.N
    assert all(torch.equal(za[0, 0], model.z_H0) for *_, za in steps)


def test_analyze_refuses_other_archs(runs):
    from tools import analyze
    with pytest.raises(UserError, match="the HLRole analyses need an HRM"):
        analyze.main([f"--out_dir={runs[1]}"])
    with pytest.raises(UserError, match="no checkpoint"):
        analyze.main(["--out_dir=/nonexistent"])


def test_plot_defaults_beside_the_runs_with_iteration_0_and_unigram(runs, capsys):
    """No --out: curves.png goes in the first run's folder; the title names the runs; the y axis keeps
    iteration 0 in view; the unigram line of the run's dataset is drawn."""
    import os
    import matplotlib.pyplot as plt
    from tools import plot
    saved = {}
    real = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, path, *a, **k: (saved.update(fig=fig), real(fig, path, *a, **k))[1]
    try:
        plot.main([*runs])
    finally:
        plt.Figure.savefig = real
    assert os.path.exists(os.path.join(runs[0], "curves.png"))
    ax = saved["fig"].axes[0]
    assert "hrm" in ax.get_title() and "tf" in ax.get_title()
    lo, hi = ax.get_ylim()
    first = raw_log(runs[0])[0]
    assert first["iter"] == 0 and lo <= first["val_loss"] <= hi     # iteration 0 on the chart
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(lab.startswith("unigram ") for lab in labels), labels


def test_read_log_skips_malformed_lines(tmp_path, capsys):
    from tools.plot import load_log
    (tmp_path / "log.jsonl").write_text('{"iter": 4, "val_loss": 2.0}\n{"iter": 0, "val_loss": 5.0}\n'
                                        '{"iter": 2, "val_l\n[1, 2]\n\n{"iter": 2, "val_loss": 3.0}\n')
    assert [r["iter"] for r in load_log(str(tmp_path))] == [0, 2, 4]
    assert capsys.readouterr().err.strip() == f"note: skipped 2 malformed line(s) in {tmp_path / 'log.jsonl'}"


@pytest.mark.parametrize("case", ["nan_log", "unsupported", *[pytest.param(c, marks=pytest.mark.slow)
                                                                for c in ("out_folder", "read_only")]])
def test_plot_refuses_before_drawing(case, runs, tmp_path):
    run = runs[0]
    out = tmp_path / "chart.png"
    if case == "nan_log":
        run = str(tmp_path / "nan")
        os.makedirs(run)
        with open(os.path.join(run, "log.jsonl"), "w") as f:
            f.write('{"iter": 0, "val_loss": NaN}\n{"iter": 2, "val_loss": NaN}\n')
    elif case == "out_folder":
        out = tmp_path
    elif case == "read_only":
        ro = tmp_path / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        out = ro / "chart.png"
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
    else:
        out = tmp_path / "chart.xyz"
    p = run_script("tools/plot.py", run, f"--out={out}")
    word = {"nan_log": "no finite val_loss", "out_folder": "is a folder", "read_only": "not writable",
            "unsupported": "matplotlib cannot write .xyz"}[case]
    assert word in one_error_line(p, prog="plot.py")
    assert not os.path.exists(tmp_path / "chart.png") and not os.path.exists(tmp_path / "chart.xyz")


@pytest.mark.slow   # trains a character model (CI time); CI draws the one-dataset unigram line
def test_plot_draws_one_unigram_line_per_dataset(runs, char_data, tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    char = str(tmp_path / "char")
    run_train(char_tiny(char, "--max_iters=2"), char_data, char)
    from tools import plot
    saved = {}
    real = plt.Figure.savefig
    plt.Figure.savefig = lambda self, *a, **k: saved.setdefault("labels", [t.get_text() for t in self.axes[0].get_legend().get_texts()])
    try:
        plot.main([runs[0], char, f"--out={tmp_path / 'c.png'}"])
    finally:
        plt.Figure.savefig = real
    uni = [l for l in saved["labels"] if l.startswith("unigram")]
    assert len(uni) == 2 and any("(shakespeare)" in l for l in uni) and any("(shakespeare_char)" in l for l in uni), uni


def test_depth_at_inference(runs, data_dir, tmp_path):
    from tools import analyze
    hrm = runs[0]
    rows = analyze.main([f"--out_dir={hrm}", f"--data_dir={data_dir}", "--batches=2", "--depth=0.5,1,2",
                         f"--json={tmp_path / 'd.json'}"])
    model, ck = analyze.load(hrm, "ckpt.pt", "cpu")
    batches = analyze.val_batches(ck, data_dir, 2, 1, model.config.block_size)
    one = [r for r in rows if r["depth"] == 1.0]
    assert len(one) == 1 and one[0]["ce"] == analyze.val_ce(model, batches, "cpu")   # depth 1 is the model itself
    c = model.config
    assert {(r["varied"], r["N"], r["T"]) for r in rows} == {("N", max(1, round(c.N / 2)), c.T), ("N", c.N, c.T),
                                                            ("N", 2 * c.N, c.T), ("T", c.N, max(1, round(c.T / 2))),
                                                            ("T", c.N, 2 * c.T)}
    assert json.load(open(tmp_path / "d.json"))["rows"] == rows
    with pytest.raises(UserError, match="positive multiples"):
        analyze.main([f"--out_dir={hrm}", "--depth=0,x"])


def test_cache_policies_measured(runs, data_dir, tmp_path):
    """--kv: token-by-token decoding under the exact cache has the model's val CE and agrees with itself;
    the shared policies report their own CE, a smaller cache (the formula), and how far greedy text strays."""
    from tools import analyze
    from hrmlm import engine
    hrm = runs[0]
    rows = analyze.main([f"--out_dir={hrm}", f"--data_dir={data_dir}", "--batches=2", "--kv=full,last,fired",
                         f"--json={tmp_path / 'kv.json'}"])
    model, ck = analyze.load(hrm, "ckpt.pt", "cpu")
    batches = analyze.val_batches(ck, data_dir, 2, 1, model.config.block_size)
    full, last, fired = rows
    assert [r["kv"] for r in rows] == ["full", "last", "fired"]
    assert abs(full["ce"] - analyze.val_ce(model, batches, "cpu")) < 1e-5 and full["greedy_agree"] == 1.0
    d, c = model.config.n_embd, model.config
    assert [r["kv_bytes_per_token"] for r in rows] == [2 * n * d * 4 for n in (1 + c.M + c.N, 3, c.N + 2)]
    assert last["ce"] != full["ce"] and 0 <= last["greedy_agree"] <= 1 and all(r["cached_tok_s"] > 0 for r in rows)
    assert json.load(open(tmp_path / "kv.json"))["rows"] == rows
    assert engine.cache_slots(model, "last") == [0] + [1] * c.M + [2] * c.N
    with pytest.raises(UserError, match="give policies from full, last, fired"):
        analyze.main([f"--out_dir={hrm}", "--kv=full,lst"])
    with pytest.raises(UserError, match="does not apply to transformer|cache policies are a recurrence's"):
        analyze.main([f"--out_dir={runs[1]}", "--kv=last"])
