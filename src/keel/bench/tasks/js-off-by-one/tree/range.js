'use strict';

// The whole numbers from `start` to `end`, both included, `step` apart.
function range(start, end, step = 1) {
  const out = [];
  for (let n = start; n < end; n += step) {
    out.push(n);
  }
  return out;
}

module.exports = { range };
