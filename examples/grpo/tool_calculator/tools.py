"""The example's one tool: the built-in code interpreter (sandboxed Python; docs/TOOLS.md), with limits for
arithmetic: 5 s, 256 MB."""
from mindrlhf.tools import CodeInterpreter, SandboxLimits

TOOLS = [CodeInterpreter(SandboxLimits(timeout=5.0, memory_mb=256))]
