// keel web front end: the sessions page (docs/web.md).
"use strict";
