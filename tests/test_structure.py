"""The package's layers import downwards only (docs/ARCHITECTURE.md, "Dependency direction"):
errors <- utils <- configs <- parallel <- models <- data, reward, checkpoint, rollout, tools <- trainer <- cli, demo, eval;
and no two modules import each other, directly or round a circle, at the top or inside a function."""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "mindrlhf")
LAYER = {"errors": -2, "utils": -1, "configs": 0, "parallel": 1, "models": 2, "data": 3, "reward": 3, "checkpoint": 3,
         "rollout": 3, "tools": 3, "trainer": 4, "cli": 5, "demo": 5, "eval": 5, "sft": 5, "verl_main": 5}


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


def _module_of(path):
    rel = os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, ".")
    return "mindrlhf." + (rel[:-len(".__init__")] if rel.endswith("__init__") else rel)


def _import_graph():
    """module -> the package modules it imports anywhere in its file (a name imported from a package counts
    as that package's module when there is one, else the package's __init__)."""
    files = {}
    for dirpath, _, names in os.walk(PACKAGE):
        for f in names:
            if f.endswith(".py"):
                files[_module_of(os.path.join(dirpath, f))] = os.path.join(dirpath, f)
    graph = {}
    for module, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mindrlhf"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in files else node.module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("mindrlhf"))
        graph[module] = {e for e in edges if e in files and e != module}
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_between_modules():
    """A circle (held together by imports inside functions) means two modules are one concept or one of them
    is in the wrong layer."""
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_circle_check_sees_an_import_inside_a_function():
    graph = _import_graph()
    assert "mindrlhf.configs.model_config" not in graph["mindrlhf.configs.compat.hf"] or \
        "mindrlhf.configs.compat.hf" not in graph["mindrlhf.configs.model_config"]
    graph["mindrlhf.configs.model_config"] = graph["mindrlhf.configs.model_config"] | {"mindrlhf.configs.compat.hf"}
    assert _cycles(graph), "a lazy import back from model_config to hf_config is a circle"


def test_the_loss_inputs_are_named_in_one_place():
    """trainer/update/: the engines pass LossInputs through unnamed; GRPOLossCell.terms is the one reader and
    unpacks them in the dataclass's field order (a field added to LossInputs and not there fails here)."""
    from mindrlhf.trainer.update.loss_inputs import field_names
    tree = ast.parse(open(os.path.join(PACKAGE, "trainer", "update", "loss.py"), encoding="utf-8").read())
    terms = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "terms")
    unpack = next(n for n in ast.walk(terms) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
                  and n.value.id == "loss_inputs")
    assert tuple(e.id for e in unpack.targets[0].elts) == field_names()
    named = []
    for dirpath, _, files in os.walk(os.path.join(PACKAGE, "trainer")):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and f not in ("loss.py", "loss_inputs.py", "grpo_math.py"):
                text = open(path, encoding="utf-8").read()
                if "old_logp, rollout_logp, ref_logp" in text:
                    named.append(os.path.relpath(path, PACKAGE))
    assert not named, "the loss inputs written out by name outside update/loss.py: " + ", ".join(named)
