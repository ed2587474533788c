"""The script language for fakes (defined in `keel.llm.script`, re-exported here)."""

from keel.llm.script import Fault, FaultKind, Reply, ScriptDivergence, Step, next_tool_id, reply

__all__ = ["Fault", "FaultKind", "Reply", "ScriptDivergence", "Step", "next_tool_id", "reply"]
