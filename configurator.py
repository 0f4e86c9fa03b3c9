"""
The configurator of train.py and sample.py (nanoGPT's, made strict), the one reader of their settings blocks
(read_settings: defaults and comments, without running the script), and the checks of train.py's settings
(model.py's ModelConfig checks its own fields).

    python train.py config/X.py --batch_size=4 --compile=False

Config files (arguments without "--") run in order and may assign only existing keys; then each --key=value sets
one key to a Python literal (else a string) of its default's type, None only where the default is None. A mistake
stops the program with one line naming the valid choices, or for a config file that raises, its own path and line.
"""

import ast
import glob
import math
import os
import sys
import traceback
import types

from hrmlm.common import fail


class ConfigError(ValueError):
    pass


def _check_type(key, value, default):
    if default is None:   # a key whose default is None takes any value (e.g. train.py's fast_attn_steps)
        return value
    if value is None:
        raise ConfigError(f"--{key} cannot be None: its type is {type(default).__name__} "
                          f"(only keys whose default is None take None)")
    if isinstance(default, float) and type(value) is int:   # not a bool
        value = float(value)
    if type(value) is not type(default):
        want = f"of type {type(default).__name__} (default {default!r})"
        raise ConfigError(f"--{key} must be {'True or False' if isinstance(default, bool) else want}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):   # a NaN passes every range check
        raise ConfigError(f"--{key} must be a finite number, got {value!r}")
    return value


def _run_config_file(path, config):
    """Execute a config file in a scope holding the current config; return that scope. An exception in it is one
    ConfigError naming the file's own path and line (not File "<string>")."""
    if os.path.isdir(path):
        choices = ", ".join(sorted(glob.glob(os.path.join(path, "*.py"))))
        raise ConfigError(f"config file {path!r} is a directory, not a .py file; in it: {choices or '(no .py files)'}")
    if not os.path.exists(path):
        choices = ", ".join(sorted(glob.glob(os.path.join(os.path.dirname(path) or "config", "*.py"))))
        raise ConfigError(f"config file {path!r} not found; available: {choices or '(none)'}")
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path!r}: {type(e).__name__}: {e}") from None
    scope = dict(config)   # one dict as globals: helpers defined in the file can see its other names

    def include(name):   # include("char_testbed.py"): settings that several configs share, written once
        other = os.path.join(os.path.dirname(path), name)
        with open(other, encoding="utf-8") as f:
            exec(compile(f.read(), other, "exec"), scope)
    scope["include"] = include
    try:
        exec(compile(source, path, "exec"), scope)
    except Exception as e:
        syntax, frames = isinstance(e, SyntaxError), traceback.extract_tb(e.__traceback__)
        line = e.lineno if syntax else next((fr.lineno for fr in reversed(frames) if fr.filename == path), "?")
        msg = e.msg if syntax else (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path}:{line}: {'SyntaxError' if syntax else type(e).__name__}: {msg}") from None
    return scope


def apply_config(argv, config):
    """Update the dict `config` (a script's globals of simple values) from argv. Raises ConfigError."""
    valid = sorted(k for k in config if not k.startswith("_"))
    defaults = dict(config)   # types are checked against these, not against what an earlier argument set
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"expected --key=value, got {arg!r}")
            where, items, literal = "", [arg[2:].split("=", 1)], True   # the value parsed once its key is known
        else:   # a config file's new values; its imports and helpers (import math, def f) are not settings
            where, scope, literal = f"{arg}: ", _run_config_file(arg, config), False
            items = [(k, v) for k, v in scope.items() if not (k.startswith("_") or k in config and v is config[k]
                                                              or isinstance(v, types.ModuleType) or callable(v))]
        for key, value in items:
            if key not in config or key.startswith("_"):
                raise ConfigError(f"{where}unknown config key {key!r}; valid keys: {', '.join(valid)}")
            if literal:
                try:
                    value = ast.literal_eval(value)
                except (SyntaxError, ValueError, TypeError):   # TypeError: an unhashable key, {[]: 1}
                    pass   # kept as the string it is
            try:
                config[key] = _check_type(key, value, defaults[key])
            except ConfigError as e:
                raise ConfigError(f"{where}{e}") from None
    return config


def read_settings(path):
    """A script's settings, read from its source without running it: {name: (default, comment)} for each
    simple assignment `name = <literal>  # comment` above its `configure(...)` line, in order."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines, settings = source.splitlines(), {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(getattr(node.value, "func", None), "id", "") == "configure":
            break
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                default = ast.literal_eval(node.value)
            except ValueError:
                continue
            rest = lines[node.end_lineno - 1][node.end_col_offset:].strip()
            settings[node.targets[0].id] = (default, rest[1:].strip() if rest.startswith("#") else "")
    return settings


def configure(scope, argv=None, prog=None):
    """apply_config on a script's settings block (read_settings: nothing imported, no helper), back into its globals;
    --help: the docstring, each setting's default and comment. On error one line, exit status 2 (common.fail)."""
    settings, prog = read_settings(scope["__file__"]), prog or os.path.basename(sys.argv[0])
    keys = {k: scope[k] for k in settings}
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print((scope.get("__doc__") or "").strip() + "\n")
        print(f"usage: python {prog} [config/FILE.py ...] [--key=value ...]\n\nsettings (default, what it does):")
        width = max(len(f"--{k}={v!r}") for k, (v, _) in settings.items())
        for k, (v, comment) in settings.items():
            print(f"  {f'--{k}={v!r}':<{width}}  {comment}")
        sys.exit(0)
    try:
        apply_config(argv, keys)
    except ConfigError as e:
        fail(str(e), prog=prog)
    scope.update(keys)
    return keys


def check_train_settings(config, ddp):
    """train.py's settings that no run can use, one line each (a NaN or Inf was refused when it was set)."""
    errors = []
    if config["dtype"] not in ("float32", "bfloat16", "float16"):
        errors.append(f"dtype must be auto, float32, bfloat16 or float16, got {config['dtype']!r}")
    src, out = config["init_from"], os.path.realpath(config["out_dir"] or ".")
    if src not in ("scratch", "resume") and not os.path.exists(src):
        errors.append(f"init_from must be 'scratch', 'resume', or a checkpoint or out_dir to start from; "
                      f"{src!r} does not exist")
    elif src not in ("scratch", "resume") and (os.path.realpath(src) + os.sep).startswith(out + os.sep):
        errors.append(f"init_from={src!r} is in out_dir={config['out_dir']!r}: a new run starts in a folder of "
                      f"its own (give another --out_dir)")
    if config["fsdp"] and not ddp:
        errors.append("fsdp=True shards the model over torchrun's processes: run it with torchrun "
                      "--nproc_per_node=<GPUs> (one process holds the whole model anyway)")
    if config["fsdp"] and config["dtype"] == "float16":
        errors.append("fsdp=True trains in bfloat16 or float32 (float16 needs a sharded loss scaler); use "
                      "--dtype=bfloat16")
    if config["random_depth"] and (config["arch"] == "transformer" or config["K_slow"] or
                                   config["fast_attn_steps"] is not None):
        errors.append(f"random_depth=True varies the recurrence of hrm/unitf, with K_slow=0 and fast_attn_steps=None "
                      f"(both are counted in steps a shallower draw may not have); got arch={config['arch']!r}, "
                      f"K_slow={config['K_slow']}, fast_attn_steps={config['fast_attn_steps']}")
    kv = config["train_kv"]
    if kv != "full" and (config["arch"] != "unitf" or kv != "last" or ddp or config["compile"]):
        errors.append(f"train_kv={kv!r}: only 'full' (the default) or, for arch='unitf' in one process without "
                      f"compile, 'last' (HRM's shared caches need no remedy: docs/RESULTS.md section 8; its loss's "
                      f"fusion entropy spans every position at once); got arch={config['arch']!r}"
                      + (", under torchrun" if ddp else "") + (", compile=True" if config["compile"] else ""))
    least = dict(batch_size=1, max_iters=0, eval_iters=1, eval_interval=1, log_interval=1, max_nonfinite=1,
                 min_lr=0, weight_decay=0, grad_clip=0, warmup_iters=0, lr_decay_iters=0, seed=0, vocab_size=0)
    errors += [f"{k} must be >= {v}, got {config[k]}" for k, v in least.items() if config[k] < v]
    errors += [f"{k} must be > 0, got {config[k]}" for k in ("learning_rate", "scalar_lr_mult") if not config[k] > 0]
    errors += [f"{k} must be in [0, 1), got {config[k]}" for k in ("beta1", "beta2") if not 0 <= config[k] < 1]
    if config["decay_lr"] and config["min_lr"] > config["learning_rate"] > 0:
        errors.append(f"min_lr={config['min_lr']:g} is above learning_rate={config['learning_rate']:g}: the cosine "
                      f"'decay' would climb to it; set min_lr <= learning_rate (decay_lr=False: a constant rate)")
    return errors


def train_setting_notes(c):
    """Settings that contradict each other where a user may mean it: one printed note each (train.py goes on).
    A user who means them reads what the run will do; one who does not sees the slip before the first step."""
    notes, its, lr = [], c["max_iters"], c["learning_rate"]
    decay = c["lr_decay_iters"] or its
    if c["decay_lr"] and its > 0 and c["warmup_iters"] >= its:
        notes.append(f"warmup_iters={c['warmup_iters']} >= max_iters={its}: the learning rate never reaches "
                     f"learning_rate={lr:g} (it peaks at {lr * its / (c['warmup_iters'] + 1):.3g} on the last iteration)")
    elif c["decay_lr"] and c["lr_decay_iters"] and c["lr_decay_iters"] <= c["warmup_iters"]:
        notes.append(f"lr_decay_iters={c['lr_decay_iters']} <= warmup_iters={c['warmup_iters']}: after the warmup "
                     f"the learning rate drops straight to min_lr={c['min_lr']:g} (no cosine decay)")
    if c["decay_lr"] and its > c["warmup_iters"] and decay > its:
        notes.append(f"lr_decay_iters={decay} > max_iters={its}: the run ends before the cosine reaches "
                     f"min_lr={c['min_lr']:g} (a longer schedule cut short)")
    if not c["decay_lr"] and c["warmup_iters"] > 0:
        notes.append(f"decay_lr=False: the learning rate is learning_rate={lr:g} from the first iteration; "
                     f"warmup_iters={c['warmup_iters']} is not used (no warmup)")
    if c["arch"] in ("hrm", "unitf"):
        m = c["N"] * c["T"] if c["arch"] == "hrm" else c["M"] or 12
        depth, name = (c["N"], "N") if c["arch"] == "hrm" else (m, "M")
        if c["random_depth"] and depth == 1:
            notes.append(f"random_depth=True with {name}=1: the depth drawn from 1..2*{name}-1 is always 1, "
                         f"so every iteration trains at the configured depth")
        if c["K"] > m:
            notes.append(f"K={c['K']} > M={m}: every step carries gradient, full backprop (as K=M={m})")
        if c["arch"] == "hrm" and c["K_slow"] > c["N"]:
            notes.append(f"K_slow={c['K_slow']} > N={c['N']}: every Slow firing carries gradient (as K_slow=N)")
    if its > 0 and not c["eval_only"] and c["eval_interval"] > its:
        notes.append(f"eval_interval={c['eval_interval']} > max_iters={its}: the run evaluates and saves a checkpoint "
                     f"only at iterations 0 and {its}; a crash before the end loses the run")
    if its > 0 and not c["eval_only"] and c["log_interval"] > its:
        notes.append(f"log_interval={c['log_interval']} > max_iters={its}: no progress line will be printed")
    if c["scalar_lr_mult"] != 1 and c["arch"] != "hrm":
        notes.append(f"scalar_lr_mult={c['scalar_lr_mult']:g} sets the lr of HRM's alpha and tau; arch={c['arch']!r} "
                     f"has no such scalars, so it changes nothing")
    if c["init_from"] == "resume" and c["overwrite"]:
        notes.append("overwrite=True does nothing with init_from=resume: the run in out_dir is resumed, nothing "
                     "deleted (to start over, leave out init_from)")
    return [f"note: {n}" for n in notes]


def model_config(settings):
    """The model.ModelConfig in a dict of train.py settings: every field is a setting of the same name."""
    from model import MODEL_FIELDS, ModelConfig
    return ModelConfig(**{f: settings[f] for f in MODEL_FIELDS})
