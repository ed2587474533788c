"""The web front end's files (docs/web.md): plain HTML, CSS and JavaScript served by `keel serve`
as they are (no build step, nothing from another origin). `keel.server.webpage` serves them."""
