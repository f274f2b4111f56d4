// rhea subscriber for the foreign-client tests: a receiver link named --link from --topic (a topic or a
// filter; source timeout --expiry seconds, -1: expiry-policy never), reporting every delivery (its tag,
// the message id, body size and `to`) as JSON lines (--report) before it accepts it. With --second it asks for
// receiver-settle-mode second (rhea then accepts without settling, and settles when the router
// does). rhea's reconnect brings the connection back (the next URL of --url) and attaches the
// receiver again with the same name and source: the same subscription, resumed. With --drain it grants
// no credit window: every 200 ms it grants --credit and drains (a pull consumer).
'use strict';
const rhea = require('rhea');
const { parseArgs, required, report, connectOptions } = require('./common.js');

const args = parseArgs(process.argv);
const rep = report(required(args, 'report'));
const expiry = Number(args.expiry === undefined ? 600 : args.expiry);
const credit = Number(args.credit || 100);

const container = rhea.create_container({ id: args.container });
container.on('connection_open', (context) => rep('connected', { router: ((context.connection.remote.open || {}).properties || {})['oncemesh.router'] }));
container.on('receiver_open', (context) => {
    const src = context.receiver.remote.attach.source || {};
    rep('attached', { timeout: src.timeout === undefined ? null : src.timeout,
                      rcv_settle_mode: context.receiver.remote.attach.rcv_settle_mode || 0 });
    if (args.drain && !ticking) {
        // every 200 ms: once the credit is used up (by messages, or returned by the router's
        // answer to the drain), grant --credit again and drain
        const receiver = context.receiver;
        ticking = setInterval(() => {
            if (receiver.is_open() && receiver.credit === 0) {
                receiver.add_credit(credit);
                receiver.drain_credit();
            }
        }, 200);
    }
});
let ticking;
container.on('receiver_drained', (context) => rep('drained', { credit: context.receiver.credit }));
container.on('message', (context) => {
    const m = context.message;
    const body = typeof m.body === 'string' ? m.body : String(m.body);
    rep('msg', { tag: Buffer.from(context.delivery.tag).toString('latin1'), id: String(m.message_id), key: body.split(';')[0], size: body.length,
                 to: m.to === undefined ? null : m.to });
    context.delivery.accept();
});
container.on('disconnected', (c) => rep('disconnected', { error: String(c.error || c.reconnecting) }));
container.on('receiver_error', (c) => rep('link_error', { error: String(c.receiver.error && c.receiver.error.description) }));
container.on('connection_error', (c) => rep('error', { error: String(c.connection.error && c.connection.error.description) }));
container.on('error', (c) => rep('error', { error: String(c.error) }));

const conn = container.connect(connectOptions(args));
const source = { address: required(args, 'topic'), durable: 2 };
if (expiry < 0) source.expiry_policy = 'never';
else Object.assign(source, { expiry_policy: 'link-detach', timeout: expiry });
conn.open_receiver({
    name: required(args, 'link'),
    source,
    autoaccept: false,
    credit_window: args.drain ? 0 : credit,
    rcv_settle_mode: args.second ? 1 : 0,
});
