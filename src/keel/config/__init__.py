"""keel.config: settings files and their precedence."""
