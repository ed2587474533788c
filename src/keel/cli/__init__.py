"""keel.cli: the entry point and the front ends (headless printers; the TUI later)."""
