// MQTT.js subscriber for the MQTT foreign-client tests: subscribes to --topic at --qos (with
// --persistent: clean 0 and, MQTT 5, session expiry --expiry; subscribing only when the session is
// not present: the subscription is the session's) and reports every message MQTT.js emits (`msg`:
// key, topic, DUP flag of the PUBLISH, packet id). MQTT.js reconnects by itself, with a failover
// list (--url A,B) to the next server of its `servers`, keeping its incoming QoS 2 state (PUBREC
// sent, no PUBREL yet) when the session is present.
//
// MQTT.js emits a QoS 2 message on its PUBREL, having sent PUBREC on the PUBLISH and kept the
// message in its incoming store (in memory here). A process that ends in between would lose
// messages the router already counts as accepted (PUBREC is the acceptance), so SIGTERM stops
// gracefully: the packet ids whose PUBREC went out ('packetsend') and that were not emitted yet are
// tracked; once there are none, in the same turn of the event loop, the client ends (DISCONNECT,
// nothing more read). What was not answered by then the router hands again to the session's next
// connection. After --drain seconds without such a moment the report says `stop_unclean`.
'use strict';
const mqtt = require('mqtt');
const { parseArgs, report, connectTo, peer, errorEvent, msgFields } = require('./common');

const a = parseArgs(process.argv);
const rep = report(a.report);
const qos = Number(a.qos);
const v5 = a.mqtt === '5';
const client = connectTo(mqtt, a, {
    clientId: a['client-id'],
    protocolVersion: v5 ? 5 : 4,
    clean: !a.persistent,
    keepalive: 10,
    reconnectPeriod: 200,
    connectTimeout: 10000,
    resubscribe: false,
    properties: v5 ? { sessionExpiryInterval: a.persistent ? Number(a.expiry) : 0 } : undefined,
});
const waiting = new Set(); // PUBREC sent, message not emitted yet
let stopping = null; // when SIGTERM came
let ended = false;

client.on('connect', (connack) => {
    const present = !!connack.sessionPresent;
    rep('connected', { present, url: peer(client) });
    if (!(present && a.persistent)) {
        client.subscribe(a.topic, { qos }, (err, granted) => {
            if (err) rep('error', { error: String(err.message || err) });
            else rep('subscribed', { granted: granted.map((g) => g.qos) });
        });
    }
});
client.on('packetsend', (p) => {
    if (p.cmd === 'pubrec') waiting.add(p.messageId);
});
client.on('message', (topic, body, packet) => {
    if (packet.qos === 2) waiting.delete(packet.messageId);
    rep('msg', Object.assign({ topic, dup: !!packet.dup, mid: packet.messageId, qos: packet.qos }, msgFields(body)));
    if (stopping !== null && !ended) maybeStop();
});
client.on('close', () => rep('disconnected', {}));
client.on('error', (e) => {
    // once ended, a PUBLISH read before the stream closed fails to answer ('write after end'): never
    // acknowledged, it is the router's to hand again; not an error of the run
    rep(ended ? 'after_end' : errorEvent(e), { error: String(e && e.message || e) });
});

function maybeStop() {
    const late = Date.now() - stopping > Number(a.drain) * 1000;
    if (waiting.size > 0 && !late) return false;
    if (waiting.size > 0) rep('stop_unclean', { waiting: [...waiting].sort((x, y) => x - y) });
    ended = true;
    rep('stopping', {});
    client.end(false, () => process.exit(0));
    setTimeout(() => process.exit(0), 3000).unref();
    return true;
}

process.on('SIGTERM', () => {
    if (stopping !== null) return;
    stopping = Date.now();
    if (!client.connected) {
        rep('stopping', {});
        process.exit(0);
    }
    const tick = setInterval(() => { if (ended || maybeStop()) clearInterval(tick); }, 10);
});
