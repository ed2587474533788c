"""keel.session: session records, the journal, and where session files live."""
