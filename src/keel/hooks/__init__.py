"""keel.hooks: Claude Code–format hooks: configuration and trust (config.py) and running them
(runner.py). The loop and the tool runner decide what an outcome does."""
