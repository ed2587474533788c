'use strict';

// Seconds in `text` (see SPEC.md).
function parseDuration(text) {
  throw new Error('not implemented');
}

module.exports = { parseDuration };
