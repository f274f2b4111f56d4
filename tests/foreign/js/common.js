// Shared by the rhea publisher and subscriber of the foreign-client tests: arguments, the JSON-lines
// report, connection options (failover list, SASL PLAIN, TLS). Written for these tests; plain rhea.
'use strict';
const fs = require('fs');

function parseArgs(argv) {
    const out = {};
    for (let i = 2; i < argv.length; i++) {
        const k = argv[i];
        if (!k.startsWith('--')) usage(`unexpected argument ${k}`);
        const name = k.slice(2);
        if (name === 'second' || name === 'drain') { out[name] = true; continue; }
        if (i + 1 >= argv.length) usage(`${k} needs a value`);
        out[name] = argv[++i];
    }
    return out;
}

function usage(why) {
    process.stderr.write(`error: ${why}\n`);
    process.exit(2);
}

function required(args, k) {
    if (args[k] === undefined) usage(`--${k} is required`);
    return args[k];
}

// One JSON object per line, written synchronously: the test reads the file while the client runs,
// and a killed client must leave every line it wrote.
function report(path) {
    const fd = fs.openSync(path, 'a');
    return (ev, fields) => fs.writeSync(fd, JSON.stringify(Object.assign({ ev, ts: Date.now() / 1000 }, fields || {})) + '\n');
}

// The URL list is the failover list: rhea asks connection_details before each connection attempt
// (the first and every reconnect); each call takes the next URL, round robin.
function connectOptions(args) {
    const urls = required(args, 'url').split(',').filter((u) => u);
    let next = 0;
    const ca = args.ca ? fs.readFileSync(args.ca) : undefined;
    const opts = {
        container_id: required(args, 'container'),
        idle_time_out: 2000,
        reconnect: true,
        initial_reconnect_delay: 100,
        max_reconnect_delay: 1000,
        connection_details: () => {
            const u = new URL(urls[next++ % urls.length]);
            const d = { host: u.hostname, port: Number(u.port) || 5672 };
            // (rhea hands `options` to tls.connect: the CA goes there, not beside transport)
            if (u.protocol === 'amqps:') Object.assign(d, { transport: 'tls', options: { ca } });
            return d;
        },
    };
    if (args.user) Object.assign(opts, { username: args.user, password: args.password });
    return opts;
}

module.exports = { parseArgs, required, report, connectOptions };
