// MQTT.js publisher for the MQTT foreign-client tests: publishes --count messages to --topic at
// --qos, at most --rate a second, reporting each as `sent` when handed to MQTT.js and `acked` when
// its publish callback says the protocol's last acknowledgement came (QoS 2: PUBCOMP). MQTT.js
// reconnects by itself (reconnectPeriod), with a failover list (--url A,B) to the next server of its
// `servers`, and queues what is published while it is away. --persistent: clean 0 and, MQTT 5,
// session expiry --expiry; MQTT.js keeps its messages in flight in its outgoing store (in memory)
// across the reconnect and sends them again there (PUBLISH with DUP, or PUBREL).
'use strict';
const mqtt = require('mqtt');
const { parseArgs, report, connectTo, peer, errorEvent, payload } = require('./common');

const a = parseArgs(process.argv);
const rep = report(a.report);
const count = Number(a.count || 100);
const rate = Number(a.rate);
const qos = Number(a.qos);
const client = connectTo(mqtt, a, {
    clientId: a['client-id'],
    protocolVersion: a.mqtt === '5' ? 5 : 4,
    clean: !a.persistent,
    keepalive: 10,
    reconnectPeriod: 200,
    connectTimeout: 10000,
    properties: a.mqtt === '5' ? { sessionExpiryInterval: a.persistent ? Number(a.expiry) : 0 } : undefined,
});
let next = 0;
let acked = 0;
let started = null;

let connacks = 0; // (counted as they come: MQTT.js emits 'connect' only once it sent its stored packets again)

client.on('packetreceive', (p) => {
    if (p.cmd === 'connack') connacks++;
});
client.on('connect', (connack) => {
    rep('connected', { present: !!connack.sessionPresent, url: peer(client) });
    if (started === null) {
        started = Date.now();
        pump();
    }
});
client.on('close', () => rep('disconnected', {}));
client.on('error', (e) => rep(errorEvent(e), { error: String(e && e.message || e) }));

function pump() {
    while (next < count) {
        if (rate > 0 && next > (Date.now() - started) / 1000 * rate) {
            setTimeout(pump, 5);
            return;
        }
        const k = next++;
        client.publish(a.topic, payload(a['client-id'], k, Number(a.size)), { qos }, (err, packet) => {
            // PUBCOMP 0x92 (Packet Identifier not found) after a reconnect answers a PUBREL sent again
            // for an exchange the router had ended (its PUBCOMP lost with the connection): "not an
            // error during recovery" (MQTT 5, 3.7.2.1); MQTT.js calls it a publish error, yet the
            // exchange is complete: reported as acked with its reason code
            const recovered = err && err.code === 0x92 && connacks > 1 && packet && packet.cmd === 'pubcomp';
            if (err && !recovered) {
                rep('error', { k, error: String(err.message || err), rc: err.code });
                return;
            }
            rep('acked', { k, mid: packet && packet.messageId, rc: (packet && packet.reasonCode) || 0 });
            if (++acked === count) {
                rep('done', {});
                client.end(false, () => process.exit(0));
            }
        });
        rep('sent', { k });
    }
}
