"""Compile a Cell's `@ms.jit` construct for given inputs now, without running it; its first real call with
inputs of the same shapes and dtypes then runs the compiled graph.

Why: MindSpore's compiler front end (parse, type inference, autodiff) needs a transient heap several times
the size of what it keeps, and glibc keeps the freed part as fragmented free memory, so each compile raises
the process's RSS for good. The trainer compiles its largest graph (the training step) before anything else:
the smaller graphs compiled later (rollout, reference) then fit into the memory it freed (docs/BENCHMARKS.md, "Measurements behind code choices").

MindSpore 2.10 has no public "compile only" call for a jit method (`MS_DEV_PRECOMPILE_ONLY` stops after the
front end and the later call then fails), so this makes the calls its jit wrapper makes
(`mindspore.graph.api._JitExecutor`), minus the run. `available()` says whether that API is there.
"""
from __future__ import annotations


def _executor_api():
    try:
        from mindspore._c_expression import GraphExecutor_, JitExecutor_
        from mindspore.graph.api import _JitExecutor, _pynative_executor
    except ImportError:
        return None
    if not (hasattr(_JitExecutor, "compile") and all(hasattr(executor, "clear_compile_arguments_resource")
                                                     for executor in (GraphExecutor_, JitExecutor_))):
        return None
    return _JitExecutor, _pynative_executor


def available() -> bool:
    """True where this MindSpore has the jit executor API compile_jit_cell relies on (2.10 does)."""
    return _executor_api() is not None


def compile_jit_cell(cell, *args) -> None:
    """Compile `cell.construct` (decorated with `@ms.jit`) for `args` - the positional inputs its calls will
    pass, same shapes and dtypes - without running it. Compile errors are raised here, as the first call
    would raise them."""
    api = _executor_api()
    if api is None:
        raise RuntimeError("this MindSpore has no mindspore.graph.api._JitExecutor to compile ahead with "
                           "(mindrlhf.utils.compile_ahead.available() tells before calling)")
    jit_executor, pynative = api
    construct = type(cell).construct
    if not getattr(construct, "__wrapped_by_jit__", False):
        raise TypeError(f"{type(cell).__name__}.construct is not decorated with @ms.jit")
    fn = construct.__wrapped__
    # what the jit wrapper does per call: an executor bound to the cell (the compile key is the cell's
    # creation time, id and the inputs' shapes and dtypes), then compile; the wrapper would run it next
    executor = jit_executor(fn, 0, None, cell, None, 0, getattr(construct, "__jit_graph_name__", ""))
    pynative.set_jit_compile_phase("")
    phase = executor.compile(fn.__name__, *args)
    pynative.set_jit_compile_phase(phase)
    # the run would consume the inputs the compile kept (converted arguments keyed by object address, and
    # the arguments themselves); without a run, release them as MindSpore does when it skips a compile
    executor._graph_executor.clear_compile_arguments_resource()
