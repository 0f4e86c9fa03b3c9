#!/usr/bin/env bash
# The small-scale reproduction in docs/RESULTS.md: every run, then every table and plot.
# About 60 minutes on a 2-core CPU. Run from the repository root after `python prepare.py`.
set -euo pipefail
R=out-repro
for seed in 1337 42; do
  # the paper's central contrast at matched stored parameters (7.44M / 7.48M / 7.57M)
  python train.py config/shakespeare_hrm.py         --seed=$seed --out_dir=$R/hrm-s$seed
  python train.py config/shakespeare_transformer.py --seed=$seed --out_dir=$R/transformer-s$seed
  python train.py config/shakespeare_unitf.py       --seed=$seed --out_dir=$R/unitf-d144-s$seed --n_embd=144
done
# the K ablation on an HRM with M = N*T = 8 (K = 8 is full backprop)
for K in 1 2 4 8; do
  python train.py config/shakespeare_hrm.py --N=4 --T=2 --K=$K --out_dir=$R/hrm-m8-k$K
done
# a small learning-rate check (the paper's HPSearch worry): every arch again at lr 5e-4
python train.py config/shakespeare_hrm.py         --learning_rate=5e-4 --min_lr=5e-5 --out_dir=$R/hrm-lr5e-4
python train.py config/shakespeare_transformer.py --learning_rate=5e-4 --min_lr=5e-5 --out_dir=$R/transformer-lr5e-4
python train.py config/shakespeare_unitf.py       --learning_rate=5e-4 --min_lr=5e-5 --out_dir=$R/unitf-d144-lr5e-4 --n_embd=144
python plot.py $R/hrm-s1337 $R/hrm-s42 $R/transformer-s1337 $R/transformer-s42 $R/unitf-d144-s1337 $R/unitf-d144-s42 \
  --out=docs/shakespeare_matched.png --title="Shakespeare, matched stored parameters (2 seeds each)"
python plot.py $R/hrm-m8-k1 $R/hrm-m8-k2 $R/hrm-m8-k4 $R/hrm-m8-k8 --out=docs/shakespeare_k_ablation.png \
  --title="Shakespeare, K ablation (HRM N=4, T=2, M=8)"
python analyze.py --out_dir=$R/hrm-s1337 --json=docs/analyze_hrm_s1337.json
python analyze.py --out_dir=$R/hrm-m8-k2 --json=docs/analyze_hrm_m8_k2.json
