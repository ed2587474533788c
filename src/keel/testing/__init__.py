"""Public fakes for testing code built on keel (and keel itself): a scripted provider and loopback
servers that speak each provider's wire API on 127.0.0.1. Nothing here reaches the network."""

from keel.testing.script import Fault, Reply, ScriptDivergence, Step, reply

__all__ = ["Fault", "Reply", "ScriptDivergence", "Step", "reply"]
