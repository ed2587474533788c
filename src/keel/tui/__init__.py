"""keel.tui: the interactive front ends, both consumers of the loop's events.

- `control.Controller` is what a person drives: prompts, `!cmd` lines, slash commands, the model
  and mode, sessions (clear, resume, rewind), undo. It talks to a front end through the small
  `control.FrontEnd` protocol and knows nothing about terminals.
- `app.KeelApp` is the Textual front end; `line.LineFrontEnd` prints with rich and reads stdin.

Importing this package imports neither textual nor rich; `keel.cli.interactive` picks a front end
and imports it only then.
"""
