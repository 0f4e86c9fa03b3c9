"""train.py's loop and optimiser setup against a reference written here from Algorithm 1 and the settings'
documented meaning, so that breaking any one line of them fails a test: the schedule's shape (warmup, peak,
cosine, floor), gradient accumulation (G micro-batches = one batch G times larger, and the logged gradient norm
with it), which parameters decay, AdamW's settings, the K/M clip, the logged loss, and which split the
evaluation reads. (The non-finite guard and what a resume restores: test_checkpoints.py.) Then a setting that
contradicts another: refused."""

import math
import os

import pytest
import torch

from conftest import HRM, last_state, run_train, train_error_in_process

# warmup 3, cosine to iteration 8, floor after; G=2 micro-batches of 2; a clip that binds (K/M = 1/2 of 0.1)
LR, MIN_LR, WARMUP, DECAY, ITERS, G, B = 1e-2, 1e-3, 3, 8, 10, 2, 2
WD, BETAS, CLIP = 0.3, (0.8, 0.95), 0.1
ARGS = HRM + [f"--learning_rate={LR}", f"--min_lr={MIN_LR}", f"--warmup_iters={WARMUP}", f"--lr_decay_iters={DECAY}",
              f"--max_iters={ITERS}", f"--gradient_accumulation_steps={G}", f"--batch_size={B}", "--eval_interval=1",
              "--eval_iters=1", "--log_interval=1", f"--weight_decay={WD}", f"--beta1={BETAS[0]}",
              f"--beta2={BETAS[1]}", f"--grad_clip={CLIP}", "--seed=7", "--ent_lambda=0"]
# ent_lambda=0: the entropy bonus H(w-bar) takes w-bar over a micro-batch, so with it G micro-batches are not one
# batch G times larger (0.4% apart in the gradient here); the paper defines it per batch, and train.py keeps
# micro-batches identical on any world size, so DDP still gives one process's numbers.


def expected_lr(it):
    """The schedule by its definition, written out: warmup (it+1)/(W+1) of the peak, the peak at it = W, a cosine
    from the peak to min_lr at lr_decay_iters, then the floor."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it >= DECAY:
        return MIN_LR
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * (it - WARMUP) / (DECAY - WARMUP))) / 2


@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    """train.py with the settings above, and its log.jsonl rows (one per iteration) and progress lines."""
    import json
    out = str(tmp_path_factory.mktemp("loop") / "run")
    p = run_train(ARGS, data_dir, out)
    rows = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    losses = {int(l.split()[1].split("/")[0]): float(l.split("loss ")[1].split(",")[0])
              for l in p.stdout.splitlines() if l.startswith("iter ")}
    return out, rows, losses


def reference(data_dir, ck):
    """Algorithm 1 written plainly: the same initial model, one batch of G*B (micro-batches 0..G-1 of the iteration
    side by side, no accumulation), AdamW with decay on matrices and embeddings only, the clip at grad_clip*K/M,
    the schedule above. Returns per-iteration (lr, loss, grad norm), the val CE after each, and the final model."""
    from hrmlm import common as data   # the datasets' reader
    from model import ModelConfig, build_model
    cfg = ck["config"]
    splits, _ = data.open_dataset(data_dir, cfg["dataset"], cfg["block_size"])
    torch.manual_seed(cfg["seed"])
    model = build_model(ModelConfig(**ck["model_args"]))
    mats = [p for p in model.parameters() if p.dim() >= 2]
    vecs = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": WD}, {"params": vecs, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS)
    conf = model.config
    clip = CLIP * conf.K / conf.M

    def batch(split, stream, it, j, n):
        return data.get_batch(splits, split, cfg["seed"], stream, it, j, n, cfg["block_size"])

    def val_ce():
        with torch.no_grad():
            x, y = batch("val", 2, 0, 0, cfg["batch_size"])   # evaluation: stream 2 of the val split, batch 0
            return model.cross_entropy(model(x)[0], y).item()
    steps, vals = [], [val_ce()]
    for it in range(ITERS):
        for g in opt.param_groups:
            g["lr"] = expected_lr(it)
        xs, ys = zip(*(batch("train", 0, it, j, B) for j in range(G)))
        _, loss = model(torch.cat(xs), torch.cat(ys))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps.append((expected_lr(it), loss.item(), norm))
        vals.append(val_ce())
    return steps, vals, model


def test_schedule_has_its_shape(run):
    """Warmup, peak, cosine and floor, iteration by iteration, as logged (a row per iteration: the lr it trains at)."""
    _, rows, _ = run
    lrs = {r["iter"]: r["lr"] for r in rows}
    for it in range(ITERS):
        assert lrs[it] == pytest.approx(expected_lr(it), rel=1e-12), (it, lrs[it], expected_lr(it))
    assert lrs[WARMUP] == pytest.approx(LR) and lrs[DECAY] == lrs[ITERS - 1] == pytest.approx(MIN_LR)


def test_the_loop_is_algorithm_1(run, data_dir):
    """Weights, losses, gradient norms and val CE equal the plain reference's: accumulating G micro-batches of B
    is one batch of G*B to float tolerance, and so is the logged gradient norm."""
    out, rows, losses = run
    ck = last_state(out)
    steps, vals, model = reference(data_dir, ck)
    clip = CLIP * model.config.K / model.config.M
    assert sum(norm > clip for _, _, norm in steps) >= ITERS // 2, "the clip must bind to be tested"
    by_iter = {r["iter"]: r for r in rows}
    for it, (lr, loss, norm) in enumerate(steps):
        assert by_iter[it + 1]["grad_norm"] == pytest.approx(norm, rel=1e-5), it   # logged after its iteration
        assert losses[it + 1] == pytest.approx(loss, abs=1e-4), it                 # the progress line's loss
    for it, ce in enumerate(vals):
        assert by_iter[it]["val_loss"] == pytest.approx(ce, rel=1e-5), it          # the val split, batch 0
    ours = ck["model"]   # atol: AdamW's first steps amplify rounding where a gradient is near 0 (embedding rows of
    for name, p in model.state_dict().items():   # rare tokens): 2.1e-6 apart under ATEN_CPU_CAPABILITY=avx2 here
        assert torch.allclose(ours[name], p, rtol=1e-4, atol=1e-5), (name, (ours[name] - p).abs().max().item())
    groups = ck["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [WD, 0.0] and all(tuple(g["betas"]) == BETAS for g in groups)


# --- settings that contradict each other: refused ----------------------------------------------------------

def test_min_lr_above_learning_rate_is_refused(data_dir, tmp_path):
    """A cosine 'decay' that would climb is refused; at equal rates (a constant) or without decay it runs."""
    line = train_error_in_process(["--learning_rate=1e-3", "--min_lr=1.0"], data_dir, str(tmp_path / "a"))
    assert "min_lr=1 is above learning_rate=0.001" in line, line
    for ok in (["--min_lr=1e-3"], ["--min_lr=1.0", "--decay_lr=False"]):
        run_train(HRM + ["--learning_rate=1e-3", "--max_iters=1", "--eval_interval=1", *ok], data_dir,
                  str(tmp_path / ok[-1].strip("-").replace("=", "")))
