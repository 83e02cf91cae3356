"""The package's layers import downwards only (docs/ARCHITECTURE.md, "Dependency direction"):
configs, utils <- parallel <- models <- data, reward, checkpoint, rollout <- trainer <- cli, demo, eval."""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "mindrlhf")
LAYER = {"configs": 0, "utils": 0, "parallel": 1, "models": 2, "data": 3, "reward": 3, "checkpoint": 3,
         "rollout": 3, "trainer": 4, "cli": 5, "demo": 5, "eval": 5,
         "verl_main": 5}


def _imports(path):
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mindrlhf."):
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mindrlhf."):
                    yield node.lineno, alias.name


def test_every_module_has_a_layer_and_imports_only_below_it():
    upward = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py") or f == "__init__.py" and dirpath == PACKAGE:
                continue
            path = os.path.join(dirpath, f)
            top = os.path.relpath(path, PACKAGE).split(os.sep)[0].replace(".py", "")
            assert top in LAYER, f"{path}: no layer for mindrlhf.{top}; add it to LAYER and docs/ARCHITECTURE.md"
            for line, module in _imports(path):
                target = module.split(".")[1]
                assert target in LAYER, f"{path}:{line}: unknown mindrlhf.{target}"
                if LAYER[target] > LAYER[top]:
                    upward.append(f"{os.path.relpath(path, PACKAGE)}:{line} ({top}) imports {module}")
    assert not upward, "lower layers import higher ones:\n" + "\n".join(upward)


def test_the_loop_reaches_host_collectives_only_through_exchange():
    """trainer/exchange.py is the one door from the loop to parallel/comm.py: the other trainer modules,
    the reward, data and checkpoint code ask it (votes, barriers, gathers, stage sums) instead."""
    direct = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PACKAGE)
            if not f.endswith(".py") or rel.split(os.sep)[0] in ("parallel",) or rel == os.path.join("trainer",
                                                                                                       "exchange.py"):
                continue
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom) and (node.module == "mindrlhf.parallel.comm" or (
                        node.module == "mindrlhf.parallel" and any(a.name == "comm" for a in node.names))):
                    direct.append(f"{rel}:{node.lineno}")
    assert not direct, "host collectives outside trainer/exchange.py: " + ", ".join(direct)


def test_the_trainer_file_is_the_loop():
    """Set-up lives in startup/resolve/build; grpo_trainer.py keeps the phases, collect, eval, save/resume
    and fit, and stays short enough to read at once."""
    path = os.path.join(PACKAGE, "trainer", "grpo_trainer.py")
    with open(path, encoding="utf-8") as fh:
        lines = len(fh.readlines())
    assert lines <= 330, f"{path}: {lines} lines; move set-up into trainer/resolve.py or trainer/build.py"


def test_in_graph_collectives_live_in_named_regions():
    """MindSpore's collective primitives are built only in models/tp_regions.py (TP regions) and parallel/
    (DP mean, stage sum, pipeline links, host collectives): the model and trainer code ask those by name."""
    prims = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "Send", "Receive")
    direct = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PACKAGE)
            if not f.endswith(".py") or rel.split(os.sep)[0] == "parallel" or rel == os.path.join("models",
                                                                                                    "tp_regions.py"):
                continue
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.Attribute) and node.attr in prims:
                    direct.append(f"{rel}:{node.lineno} {node.attr}")
    assert not direct, "collective primitives outside the named regions: " + ", ".join(direct)
