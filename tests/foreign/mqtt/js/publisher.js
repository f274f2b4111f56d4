// MQTT.js publisher for the MQTT foreign-client tests: publishes --count messages to --topic at
// --qos, at most --rate a second, reporting each as `sent` when handed to MQTT.js and `acked` when
// its publish callback says the protocol's last acknowledgement came (QoS 2: PUBCOMP). MQTT.js
// reconnects by itself (reconnectPeriod) and queues what is published while it is away.
'use strict';
const mqtt = require('mqtt');
const { parseArgs, report, brokerUrl, payload } = require('./common');

const a = parseArgs(process.argv);
const rep = report(a.report);
const count = Number(a.count || 100);
const rate = Number(a.rate);
const qos = Number(a.qos);
const client = mqtt.connect(brokerUrl(a), {
    clientId: a['client-id'],
    protocolVersion: a.mqtt === '5' ? 5 : 4,
    clean: true,
    keepalive: 10,
    reconnectPeriod: 200,
    connectTimeout: 10000,
    properties: a.mqtt === '5' ? { sessionExpiryInterval: 0 } : undefined,
});
let next = 0;
let acked = 0;
let started = null;

client.on('connect', (connack) => {
    rep('connected', { present: !!connack.sessionPresent });
    if (started === null) {
        started = Date.now();
        pump();
    }
});
client.on('close', () => rep('disconnected', {}));
client.on('error', (e) => rep('error', { error: String(e && e.message || e) }));

function pump() {
    while (next < count) {
        if (rate > 0 && next > (Date.now() - started) / 1000 * rate) {
            setTimeout(pump, 5);
            return;
        }
        const k = next++;
        client.publish(a.topic, payload(a['client-id'], k, Number(a.size)), { qos }, (err, packet) => {
            if (err) {
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
