'use strict';
const assert = require('node:assert/strict');
const { parseDuration } = require(process.cwd() + '/duration.js');

const good = { '1h30m': 5400, '45s': 45, '2d4h': 187200, ' 10m ': 600, '0s': 0, '1d1h1m1s': 90061 };
for (const [text, want] of Object.entries(good)) {
  assert.equal(parseDuration(text), want, text);
}
for (const bad of ['', '30m1h', '1h1h', '5', 'h', '1x', '1h 30m', '-1s', '1.5h']) {
  assert.throws(() => parseDuration(bad), (e) => e instanceof RangeError && e.message.startsWith('invalid duration'), bad);
}
console.log('duration: all checks passed');
