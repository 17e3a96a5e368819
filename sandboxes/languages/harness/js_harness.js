// fixlab's JavaScript harness: `node FLAGS js_harness.js candidate.js test.js NAMES` (sandboxes/languages/js.py).
// It runs before any candidate code: it reads the run's secret from fd 4 and closes it, keeps what it needs after the
// candidate ran in this module's closure (strict mode: no stack frame of it exposes its functions), replaces the
// globals that reach node's internals (process, console, require) by stand-ins, runs the candidate as a script of
// this context, then the task's test as a function whose parameters bind every global NAME the test uses to the value
// it had before the candidate ran (the candidate can shadow or replace a global, never what the test sees). The proof
// ("P:" + the secret in hex) goes to fd 3 only when the test returned with no failed console.assert and no exception.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');

const secret = (() => {
  const buf = Buffer.alloc(32);
  let got = 0;
  try {
    while (got < 32) {
      const n = fs.readSync(4, buf, got, 32 - got, null);
      if (n <= 0) break;
      got += n;
    }
    fs.closeSync(4);
  } catch (e) {
    got = -1; // no secret channel (run by hand): the run can fail or pass its tests, never prove it
  }
  const hex = got === 32 ? buf.toString('hex') : null;
  buf.fill(0);
  return hex;
})();

// Everything used once candidate code may have run: captured now, called through Reflect.apply's captured copy.
const apply = Reflect.apply;
const writeSync = fs.writeSync;
const format = util.format;
const inspect = util.inspect;
const captureStackTrace = Error.captureStackTrace;
const encoder = new TextEncoder();
const encode = TextEncoder.prototype.encode;
const waitCell = new Int32Array(new SharedArrayBuffer(4));
const wait = Atomics.wait;
const realProcess = process;
const realExit = process.exit;
const hrtime = process.hrtime;
const nextTick = process.nextTick;
const harnessFile = __filename;
const [candidateFile, testFile, namesArg] = process.argv.slice(2);
const candidateSource = fs.readFileSync(candidateFile, 'utf8');
const testSource = fs.readFileSync(testFile, 'utf8');
const md5 = require('js-md5'); // loaded now, from the prepared node_modules, as the reference's node loads it
const crypto = require('crypto');

function write(fd, text) { // the whole text, or false; EAGAIN (a non-blocking pipe that is full) waits and retries
  const bytes = apply(encode, encoder, [`${text}`]);
  let off = 0;
  while (off < bytes.length) {
    try {
      off += writeSync(fd, bytes, off, bytes.length - off);
    } catch (e) {
      if (e === null || typeof e !== 'object' || e.code !== 'EAGAIN') return false;
      apply(wait, Atomics, [waitCell, 0, 0, 2]);
    }
  }
  return true;
}

let failures = 0;

function callerLocation(skip) { // "test.js:LINE:COL" (or candidate.js) of the call into `skip`, or ""
  try {
    const holder = {};
    apply(captureStackTrace, Error, [holder, skip]);
    const m = /\b(test|candidate)\.js:(\d+):(\d+)/.exec(`${holder.stack}`);
    return m === null ? '' : `${m[1]}.js:${m[2]}:${m[3]}`;
  } catch (e) {
    return '';
  }
}

function assert(condition, ...args) {
  if (condition) return;
  failures += 1; // first: nothing below (formatting the candidate's values) can take it back
  try {
    if (args.length > 0) args[0] = `Assertion failed: ${args[0]}`;
    const where = callerLocation(assert);
    const text = args.length > 0 ? apply(format, null, args) : 'Assertion failed';
    write(2, text + (where ? `\n    at ${where}` : '') + '\n');
  } catch (e) {
    write(2, 'Assertion failed\n');
  }
}

function printer(fd) {
  return Object.freeze(function (...args) {
    try {
      write(fd, apply(format, null, args) + '\n');
    } catch (e) {
      write(fd, '[output that could not be formatted]\n');
    }
  });
}

const out = printer(1);
const err = printer(2);
const trustedConsole = Object.freeze({
  assert: Object.freeze(assert), log: out, info: out, debug: out, dir: out, error: err, warn: err, trace: err,
});

// A process without a way into node's internals (no binding, dlopen, mainModule, report or real streams).
const stream = (fd) => Object.freeze({ write: Object.freeze((text) => write(fd, text)), isTTY: false });
const noop = Object.freeze(function () { return standIn; });
const standIn = Object.freeze({
  argv: Object.freeze(['node', 'test.js']), env: Object.freeze({}), platform: process.platform,
  version: process.version, versions: Object.freeze({ ...process.versions }), pid: process.pid,
  exit: Object.freeze((code) => apply(realExit, realProcess, [code])),
  nextTick: Object.freeze((...args) => apply(nextTick, realProcess, args)),
  hrtime: Object.freeze(Object.assign((t) => apply(hrtime, realProcess, [t]),
    { bigint: Object.freeze(() => apply(hrtime.bigint, realProcess, [])) })),
  stdout: stream(1), stderr: stream(2), on: noop, once: noop, off: noop, addListener: noop, removeListener: noop,
});

// require: js-md5 (JavaScript/162's canonical solution) and crypto's hashes; every other module is refused.
const wrapHash = (hash) => {
  const h = Object.freeze({
    update: Object.freeze((data, enc) => { hash.update(data, enc); return h; }),
    digest: Object.freeze((enc) => hash.digest(enc)),
  });
  return h;
};
const cryptoFacade = Object.freeze({
  createHash: Object.freeze((alg) => wrapHash(crypto.createHash(`${alg}`))),
  createHmac: Object.freeze((alg, key) => wrapHash(crypto.createHmac(`${alg}`, key))),
  getHashes: Object.freeze(() => crypto.getHashes()),
});
const safeRequire = function require(name) {
  const id = `${name}`;
  if (id === 'js-md5') return md5;
  if (id === 'crypto' || id === 'node:crypto') return cryptoFacade;
  const e = new Error(`Cannot find module '${id}' (fixlab's JavaScript sandbox offers only 'js-md5' and ` +
    `'crypto' hashes)`);
  e.code = 'MODULE_NOT_FOUND';
  throw e;
};
const fakeModule = { exports: {} };
safeRequire.main = fakeModule;

function report(e) { // an exception the candidate or the test threw, as node prints an uncaught one
  let text;
  try {
    const stack = e !== null && typeof e === 'object' ? e.stack : undefined;
    text = typeof stack === 'string' && stack !== '' ? stack : `Uncaught ${inspect(e)}`;
    text = text.split('\n').filter((l) => !l.includes(harnessFile) && !/\(node:|at node:/.test(l)).join('\n');
  } catch (x) {
    text = 'Uncaught exception (it could not be shown)';
  }
  write(2, `${text}\n`);
  realProcess.exitCode = 1;
}

// The names the test uses, bound now to the values it must see.
const own = new Set(Object.getOwnPropertyNames(globalThis));
const trusted = new Map([['console', trustedConsole], ['process', standIn], ['require', safeRequire],
  ['module', fakeModule], ['exports', fakeModule.exports]]);
const names = `${namesArg || ''}`.split(',').filter((n) => n !== '' && (trusted.has(n) || own.has(n)));
const values = names.map((n) => (trusted.has(n) ? trusted.get(n) : globalThis[n]));

function main() {
  let test;
  let candidate;
  try {
    test = vm.compileFunction(testSource, names, { filename: 'test.js' });
  } catch (e) {
    write(2, 'fixlab: the task\'s test does not compile\n');
    report(e);
    return;
  }
  try {
    candidate = new vm.Script(candidateSource, { filename: 'candidate.js' });
  } catch (e) {
    report(e);
    return;
  }
  const define = (name, value) => Object.defineProperty(globalThis, name,
    { value, writable: true, configurable: true, enumerable: false });
  delete globalThis.process;
  define('process', standIn);
  define('console', trustedConsole);
  define('require', safeRequire);
  define('module', fakeModule);
  define('exports', fakeModule.exports);
  try {
    candidate.runInThisContext();
  } catch (e) {
    report(e);
    return;
  }
  try {
    apply(test, undefined, values);
  } catch (e) {
    report(e);
    return;
  }
  if (failures === 0 && secret !== null) {
    write(3, `P:${secret}\n`);
  } else {
    realProcess.exitCode = 1;
  }
}

main();
