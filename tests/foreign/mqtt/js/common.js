// Shared by the MQTT.js publisher and subscriber of the MQTT foreign-client tests: arguments, the
// JSON-lines report, the payload's key (tests/foreign/mqtt/common.py says the format). Written for
// these tests; plain MQTT.js.
'use strict';
const fs = require('fs');

const FLAGS = new Set(['persistent']);

function parseArgs(argv) {
    const out = { qos: '2', mqtt: '5', rate: '0', size: '0', expiry: '600', drain: '3' };
    for (let i = 2; i < argv.length; i++) {
        const k = argv[i];
        if (!k.startsWith('--')) usage(`unexpected argument ${k}`);
        const name = k.slice(2);
        if (FLAGS.has(name)) { out[name] = true; continue; }
        if (i + 1 >= argv.length) usage(`${k} needs a value`);
        out[name] = argv[++i];
    }
    for (const k of ['url', 'topic', 'client-id', 'report']) if (out[k] === undefined) usage(`--${k} is required`);
    return out;
}

function usage(why) {
    process.stderr.write(`error: ${why}\n`);
    process.exit(2);
}

// One JSON object per line, written synchronously: the test reads the file while the client runs,
// and a stopped client must leave every line it wrote.
function report(path) {
    const fd = fs.openSync(path, 'a');
    return (ev, fields) => fs.writeSync(fd, JSON.stringify(Object.assign({ ev, ts: Date.now() / 1000 }, fields || {})) + '\n');
}

// --url HOST:PORT, or a failover list HOST:PORT,HOST:PORT,...: MQTT.js's own `servers` option (each
// new connection, the reconnects included, goes to the next server of the list, round)
function connectTo(mqtt, args, options) {
    const list = args.url.split(',').filter((u) => u);
    if (list.length === 1) return mqtt.connect(`mqtt://${list[0]}`, options);
    const servers = list.map((u) => {
        const i = u.lastIndexOf(':');
        return { host: u.slice(0, i) || '127.0.0.1', port: Number(u.slice(i + 1)), protocol: 'mqtt' };
    });
    return mqtt.connect(Object.assign({ servers, protocol: 'mqtt' }, options));
}

// the address of the client's current connection (the server of the list it went to)
function peer(client) {
    const s = client.stream;
    return s && s.remotePort ? `${s.remoteAddress}:${s.remotePort}` : null;
}

// an error of the connection itself (the router went away): reported as `conn_error`, not `error`;
// MQTT.js reconnects by itself after it
const CONNECTION_ERRORS = new Set(['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'ECONNABORTED']);

function errorEvent(e) {
    return e && CONNECTION_ERRORS.has(e.code) ? 'conn_error' : 'error';
}

function payload(clientId, k, size) {
    return Buffer.from(`${clientId}:${k};`.padEnd(size, 'x'));
}

function msgFields(buf) {
    const cut = buf.indexOf(';');
    const out = { k: (cut < 0 ? buf : buf.subarray(0, cut)).toString(), size: buf.length };
    if (buf.length <= 512) out.hex = buf.toString('hex');
    return out;
}

module.exports = { parseArgs, report, connectTo, peer, errorEvent, payload, msgFields };
