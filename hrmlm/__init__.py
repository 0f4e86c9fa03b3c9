"""
The support code under train.py, sample.py and bench.py; the paper itself is ../model.py, which imports none of it.

    engine.py      cached decoding: the KV cache (one slot per block application) and the sampling loop
    checkpoint.py  the run folder: resume state, ckpt.pt, log.jsonl, run.json
    parallel.py    torchrun: the process group, DDP or FSDP2 around the model, signals every rank agrees on
    data.py        the datasets prepare.py writes: meta.json, the token files, batches
    common.py      one way to stop on an error, the "auto" device and dtype, atomic writes, timing
    flops.py       FLOPs of an iteration and a device's peak, for MFU
"""
