// Paho Java publisher for the MQTT foreign-client tests (MQTT 3.1.1): publishes --count messages to
// --topic at --qos, at most --rate a second, reporting each as `sent` when Paho takes it and `acked`
// when Paho's deliveryComplete says the protocol's last acknowledgement came (QoS 2: PUBCOMP). At
// most 20 in flight (Paho's max inflight; the publisher waits for a slot). Paho reconnects by
// itself (automatic reconnect, at most 1 s apart); with a failover list (--url A,B) Paho's own
// server URIs (MqttConnectOptions.setServerURIs: each connection, the reconnects included, tries them
// in order, so a dead first router is passed over). --persistent: clean session 0, and the messages
// in flight kept by Paho (MemoryPersistence, the process's life) and sent again on the reconnect
// (PUBLISH with DUP, or PUBREL). While it is away Paho refuses new messages (not connected): the
// publisher waits for the reconnect. Written for these tests; plain Eclipse Paho.
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;

import org.eclipse.paho.client.mqttv3.IMqttDeliveryToken;
import org.eclipse.paho.client.mqttv3.IMqttToken;
import org.eclipse.paho.client.mqttv3.MqttAsyncClient;
import org.eclipse.paho.client.mqttv3.MqttCallbackExtended;
import org.eclipse.paho.client.mqttv3.MqttConnectOptions;
import org.eclipse.paho.client.mqttv3.MqttException;
import org.eclipse.paho.client.mqttv3.MqttMessage;
import org.eclipse.paho.client.mqttv3.persist.MemoryPersistence;

public final class Publisher {
    private static final int INFLIGHT = 20;

    public static void main(String[] argv) throws Exception {
        Common.Args a = new Common.Args(argv);
        Common.Report rep = new Common.Report(a.get("report"));
        String cid = a.get("client-id");
        long count = a.num("count", 100);
        double rate = a.real("rate", 0);
        int qos = (int) a.num("qos", 2);
        int size = (int) a.num("size", 0);
        Semaphore slots = new Semaphore(INFLIGHT);
        AtomicInteger acked = new AtomicInteger();
        Object finished = new Object();
        String[] uris = a.uris();
        MqttAsyncClient c = new MqttAsyncClient(uris[0], cid, new MemoryPersistence());
        c.setCallback(new MqttCallbackExtended() {
            @Override public void connectComplete(boolean reconnect, String uri) {
                if (reconnect) {
                    rep.line("connected", "\"present\":null,\"reconnect\":true,\"url\":" + Common.str(Common.url(uri)));
                }
            }

            @Override public void connectionLost(Throwable cause) {
                rep.line("disconnected", "\"error\":" + Common.str(String.valueOf(cause)));
            }

            @Override public void messageArrived(String topic, MqttMessage message) {}

            @Override public void deliveryComplete(IMqttDeliveryToken token) {
                long k = (Long) token.getUserContext();
                rep.line("acked", "\"k\":" + k + ",\"mid\":" + token.getMessageId());
                slots.release();
                if (acked.incrementAndGet() == count) {
                    synchronized (finished) { finished.notifyAll(); }
                }
            }
        });
        MqttConnectOptions o = new MqttConnectOptions();
        o.setMqttVersion(MqttConnectOptions.MQTT_VERSION_3_1_1);
        o.setCleanSession(!a.flag("persistent"));
        o.setKeepAliveInterval(10);
        o.setMaxInflight(INFLIGHT);
        o.setAutomaticReconnect(true);
        o.setMaxReconnectDelay(1000);
        if (uris.length > 1) o.setServerURIs(uris);
        try {
            IMqttToken t = c.connect(o);
            t.waitForCompletion(15000);
            rep.line("connected", "\"present\":" + t.getSessionPresent() + ",\"url\":"
                     + Common.str(Common.url(c.getCurrentServerURI())));
        } catch (Exception e) {
            rep.line("error", "\"error\":" + Common.str(e.toString()));
            System.exit(1);
        }
        long start = System.nanoTime();
        for (long k = 0; k < count; k++) {
            if (rate > 0) {
                long due = start + (long) (k / rate * 1e9);
                long wait = due - System.nanoTime();
                if (wait > 0) Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
            }
            slots.acquire();
            while (true) {
                try {
                    c.publish(a.get("topic"), Common.payload(cid, k, size), qos, false, Long.valueOf(k), null);
                    break;
                } catch (org.eclipse.paho.client.mqttv3.MqttException e) {
                    int why = e.getReasonCode();
                    if (why != MqttException.REASON_CODE_CLIENT_NOT_CONNECTED
                            && why != MqttException.REASON_CODE_CONNECT_IN_PROGRESS) {
                        rep.line("error", "\"k\":" + k + ",\"error\":" + Common.str(e.toString()));
                    }
                    Thread.sleep(why == MqttException.REASON_CODE_CLIENT_NOT_CONNECTED ? 20 : 100);  // (away: try again)
                }
            }
            rep.line("sent", "\"k\":" + k);
        }
        synchronized (finished) {
            while (acked.get() < count) finished.wait(1000);
        }
        rep.line("done", "");
        c.disconnect().waitForCompletion(5000);
        c.close();
        System.exit(0);
    }
}
