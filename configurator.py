"""The configurator of train.py and sample.py, nanoGPT's made strict: `python train.py config/X.py --batch_size=4`.
Config files run in order and may assign only existing keys (include("other.py") runs a shared one); then each
--key=value sets a key to a Python literal (else a string) of its default's type. A mistake is a UserError."""

import ast
import math
import os
import re
import sys
import traceback
import types

from hrmlm.signals import UserError

RULE = "# " + "-" * 77 + "\n"   # a script's settings block lies between two such lines


def run_config_file(path, config):
    """A config file's new values, run in a scope holding the config; an exception in it names its path and line."""
    if not os.path.isfile(path):
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "config"
        found = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")) if os.path.isdir(
            folder) else []
        raise UserError(f"config file {path!r} " + ("is a directory, not a .py file; in it" if os.path.isdir(path) else
                        "not found; available") + f": {', '.join(found) or '(none)'}")
    scope = dict(config)

    def include(name):   # include("char_testbed.py"): settings that several configs share, written once
        other = os.path.join(os.path.dirname(path), name)
        with open(other, encoding="utf-8") as f:
            exec(compile(f.read(), other, "exec"), scope)
    scope["include"] = include
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), scope)
    except Exception as e:   # a file that cannot be read or decoded too
        syntax, frames = isinstance(e, SyntaxError), traceback.extract_tb(e.__traceback__)
        line = e.lineno if syntax else next((fr.lineno for fr in reversed(frames) if fr.filename == path), "?")
        msg = e.msg if syntax else (str(e).strip().splitlines() or [""])[0]
        raise UserError(f"{path}:{line}: {'SyntaxError' if syntax else type(e).__name__}: {msg}") from None
    # its imports and helpers (import math, def f) are not settings
    return [(k, v) for k, v in scope.items() if not (k.startswith("_") or k in config and v is config[k] or
                                                     isinstance(v, types.ModuleType) or callable(v))]


def apply_config(argv, config):
    """Update the dict `config` (a script's settings) from argv: config files, then --key=value. Raises UserError."""
    defaults = dict(config)   # types are checked against these, not against what an earlier argument set
    for arg in argv:
        if arg.startswith("--") and "=" not in arg:
            raise UserError(f"expected --key=value, got {arg!r}")
        where, items = ("", [arg[2:].split("=", 1)]) if arg.startswith("--") else (f"{arg}: ", run_config_file(arg, config))
        for key, value in items:
            if key not in config:
                raise UserError(f"{where}unknown config key {key!r}; valid keys: {', '.join(sorted(config))}")
            if not where:   # a --key=value: a Python literal, else the string it is
                try:
                    value = ast.literal_eval(value)
                except (SyntaxError, ValueError, TypeError):   # TypeError: an unhashable key, {[]: 1}
                    pass
            default, name = defaults[key], f"{where}--{key}"
            if isinstance(default, float) and type(value) is int:   # not a bool
                value = float(value)
            if default is not None and value is None:
                raise UserError(f"{name} cannot be None: its type is {type(default).__name__} (only keys whose "
                                f"default is None take None)")
            if default is not None and type(value) is not type(default):
                raise UserError(f"{name} must be " + ("True or False" if isinstance(default, bool) else
                                f"of type {type(default).__name__} (default {default!r})") + f", got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):   # a NaN passes every range check
                raise UserError(f"{name} must be a finite number, got {value!r}")
            config[key] = value
    return config


def configure(scope, argv=None):
    """apply_config on a script's settings (the names its settings block assigns), back into its globals. --help:
    the script's docstring and its settings block as written, each with its default and comment."""
    with open(scope["__file__"], encoding="utf-8") as f:
        block = f.read().split(RULE)[1]   # between the two rules, as in nanoGPT's scripts
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(f"{(scope.get('__doc__') or '').strip()}\n\nusage: python {os.path.basename(scope['__file__'])} "
              f"[config/FILE.py ...] [--key=value ...]\n\nsettings (default, what it does):\n{block}")
        sys.exit(0)
    keys = apply_config(argv, {k: scope[k] for k in re.findall(r"^(\w+) = ", block, re.M)})
    scope.update(keys)
    return keys
