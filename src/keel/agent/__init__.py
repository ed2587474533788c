"""keel.agent: the loop and its collaborators (limits, prompt assembly, the tool round)."""
