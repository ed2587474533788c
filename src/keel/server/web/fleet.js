// keel web front end: the fleet page (docs/web.md).
"use strict";
