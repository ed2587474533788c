"""`keel replay`: re-drive a recorded session through the real loop, offline, and report the first
request keel now builds differently from the recorded one (docs/replay.md).

`provider` serves the recorded replies and compares requests, `diff` makes the readable diffs,
`run` rebuilds the workspace and drives the agent. Nothing here is imported at startup."""
