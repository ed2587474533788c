"""keel.hooks: Claude Code–format hooks: configuration and trust (config.py), Claude Code's
payloads and event list (claude.py), running them (runner.py) and the model prompt hooks ask
(model.py). The loop and the tool runner decide what an outcome does."""
