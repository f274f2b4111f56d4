// rhea publisher for the foreign-client tests: sends --count messages to --topic on a sender link
// named --link, at most --window unsettled, reporting every transfer and outcome as JSON lines
// (--report). rhea's reconnect brings the connection back (the next URL of --url) and attaches the
// link again by itself; what was unsettled on the lost connection is in doubt (rhea forgets those
// deliveries) and is sent again under the same delivery tag: the identity oncemesh recognises
// (docs/wire-protocol.md, "Publishing"). Tags are the message numbers in decimal ASCII (rhea's own
// default counts per sender object from 0 in the same form). --rate caps new messages per second
// (0: as fast as credit allows), so that a test can act mid-stream.
'use strict';
const rhea = require('rhea');
const { parseArgs, required, report, connectOptions } = require('./common.js');

const args = parseArgs(process.argv);
const rep = report(required(args, 'report'));
const topic = required(args, 'topic');
const link = required(args, 'link');
const count = Number(args.count || 100);
const window = Number(args.window || 50);
const size = Number(args.size || 0);
const rate = Number(args.rate || 0);
const start = Date.now();
let wakeup;

const container = rhea.create_container({ id: args.container });
const unsettled = new Map(); // k -> delivery of the current connection
const outcomes = new Map(); // k -> outcome
let resend = [];
let next = 0;
let sender;

function send() {
    while (sender && sender.sendable() && unsettled.size < window) {
        let k;
        const again = resend.length > 0;
        if (again) {
            k = resend.shift();
            if (outcomes.has(k)) continue;
        } else if (next < count && (rate <= 0 || next < ((Date.now() - start) / 1000) * rate + 1)) {
            k = next++;
        } else {
            if (next < count && !wakeup) wakeup = setTimeout(() => { wakeup = undefined; send(); }, 10); // paced
            break;
        }
        const id = `${link}:${k}`;
        const body = `${id};` + 'x'.repeat(Math.max(0, size - id.length - 1));
        const d = sender.send({ message_id: id, body, durable: true }, Buffer.from(String(k)));
        d.k = k;
        unsettled.set(k, d);
        rep('sent', { k, tag: Buffer.from(String(k)).toString('hex'), resend: again });
    }
}

function outcome(context, what) {
    const d = context.delivery;
    if (unsettled.get(d.k) !== d) return; // a delivery of an earlier connection (already resent)
    unsettled.delete(d.k);
    if (!d.remote_settled) d.update(true); // receiver-settle-mode second: our settlement ends it
    if (what === 'RELEASED') {
        resend.push(d.k); // "try again": same tag
    } else {
        outcomes.set(d.k, what);
        rep('outcome', { k: d.k, tag: Buffer.from(d.tag).toString('hex'), outcome: what });
    }
    if (outcomes.size === count) {
        rep('done');
        context.connection.close();
        return;
    }
    send();
}

container.on('connection_open', (context) => rep('connected', { router: ((context.connection.remote.open || {}).properties || {})['oncemesh.router'] }));
container.on('sender_open', (context) => {
    rep('attached', { rcv_settle_mode: context.sender.remote.attach.rcv_settle_mode || 0 });
    // (also after a reconnect: the link is attached again) what was in flight is in doubt
    for (const k of unsettled.keys()) resend.push(k);
    unsettled.clear();
    resend = [...new Set(resend)].sort((a, b) => a - b);
    send();
});
container.on('sendable', send);
container.on('accepted', (c) => outcome(c, 'ACCEPTED'));
container.on('rejected', (c) => outcome(c, 'REJECTED'));
container.on('released', (c) => outcome(c, 'RELEASED'));
container.on('disconnected', (c) => rep('disconnected', { error: String(c.error || c.reconnecting) }));
container.on('sender_error', (c) => rep('link_error', { error: String(c.sender.error && c.sender.error.description) }));
container.on('connection_error', (c) => rep('error', { error: String(c.connection.error && c.connection.error.description) }));
container.on('error', (c) => rep('error', { error: String(c.error) }));

const conn = container.connect(connectOptions(args));
sender = conn.open_sender({
    name: link,
    target: { address: topic },
    snd_settle_mode: 0, // unsettled
    rcv_settle_mode: args.second ? 1 : 0,
    autosettle: true,
});
