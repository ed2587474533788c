'use strict';
const assert = require('node:assert/strict');
const { range } = require('./range');

assert.deepEqual(range(1, 5), [1, 2, 3, 4, 5]);
assert.deepEqual(range(0, 10, 5), [0, 5, 10]);
assert.deepEqual(range(3, 3), [3]);
console.log('range: all tests passed');
