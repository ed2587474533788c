"""Putting an agent together, for every front end (DESIGN.md: the loop knows nothing about the
UI): settings and options → a ready `Agent` with its session; nothing here prints."""
