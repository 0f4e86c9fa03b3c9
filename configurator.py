"""
The tiny configurator shared by train.py, sample.py and bench.py (nanoGPT's, made strict),
and the one place the scripts' "auto" device and dtype settings are resolved.

    python train.py config/X.py --batch_size=4 --compile=False

Arguments without "--" are config files, executed in order; they may only assign keys
that already exist. Then each --key=value overrides one key; the value is parsed as a
Python literal (else kept as a string) and must have the type of the default.
Any mistake stops the program with one line naming the valid choices.
"""

import ast
import glob
import os
import sys
from contextlib import nullcontext

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ConfigError(ValueError):
    pass


def _check_type(key, value, default):
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"--{key} must be True or False, got {value!r}")
    elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif type(value) is not type(default):
        raise ConfigError(f"--{key} must be of type {type(default).__name__} (default {default!r}), got {value!r}")
    return value


def apply_config(argv, config):
    """Update the dict `config` (a script's globals of simple values) from argv. Raises ConfigError."""
    valid = sorted(k for k in config if not k.startswith("_"))
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                choices = ", ".join(sorted(glob.glob(os.path.join(os.path.dirname(arg) or "config", "*.py"))))
                raise ConfigError(f"config file {arg!r} not found; available: {choices or '(none)'}")
            scope = dict(config)
            exec(open(arg).read(), {}, scope)
            for key, value in scope.items():
                if key.startswith("_") or key in config and scope[key] is config[key]:
                    continue
                if key not in config:
                    raise ConfigError(f"{arg}: unknown config key {key!r}; valid keys: {', '.join(valid)}")
                config[key] = _check_type(key, value, config[key])
        else:
            if "=" not in arg:
                raise ConfigError(f"expected --key=value, got {arg!r}")
            key, val = arg[2:].split("=", 1)
            if key not in config or key.startswith("_"):
                raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(valid)}")
            try:
                value = ast.literal_eval(val)
            except (SyntaxError, ValueError):
                value = val
            config[key] = _check_type(key, value, config[key])
    return config


def configure(scope, argv=None, prog=None):
    """apply_config on a script's globals; on error print one line and exit(2)."""
    keys = {k: v for k, v in scope.items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}
    try:
        apply_config(sys.argv[1:] if argv is None else argv, keys)
    except ConfigError as e:
        print(f"{prog or os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        sys.exit(2)
    scope.update(keys)
    return keys


def auto_device(device):
    """device="auto": "cuda" when a GPU is present, else "cpu"; any other value is kept."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(dtype, device_type):
    """dtype="auto": bfloat16 on a CUDA device that supports it, else float32; any other value is kept."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


def precision_context(device_type, dtype):
    """The forward's precision: nothing for float32, else autocast to dtype (a DTYPES name)."""
    return nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=DTYPES[dtype])
