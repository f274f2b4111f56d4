// Paho Java publisher for the MQTT foreign-client tests (MQTT 3.1.1): publishes --count messages to
// --topic at --qos, at most --rate a second, reporting each as `sent` when Paho takes it and `acked`
// when Paho's deliveryComplete says the protocol's last acknowledgement came (QoS 2: PUBCOMP). At
// most 20 in flight (Paho's max inflight; the publisher waits for a slot). Paho reconnects by
// itself (automatic reconnect). Written for these tests; plain Eclipse Paho.
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;

import org.eclipse.paho.client.mqttv3.IMqttDeliveryToken;
import org.eclipse.paho.client.mqttv3.IMqttToken;
import org.eclipse.paho.client.mqttv3.MqttAsyncClient;
import org.eclipse.paho.client.mqttv3.MqttCallbackExtended;
import org.eclipse.paho.client.mqttv3.MqttConnectOptions;
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
        MqttAsyncClient c = new MqttAsyncClient(a.uri(), cid, new MemoryPersistence());
        c.setCallback(new MqttCallbackExtended() {
            @Override public void connectComplete(boolean reconnect, String uri) {
                if (reconnect) rep.line("connected", "\"present\":null,\"reconnect\":true");
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
        o.setCleanSession(true);
        o.setKeepAliveInterval(10);
        o.setMaxInflight(INFLIGHT);
        o.setAutomaticReconnect(true);
        try {
            IMqttToken t = c.connect(o);
            t.waitForCompletion(15000);
            rep.line("connected", "\"present\":" + t.getSessionPresent());
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
                    rep.line("error", "\"k\":" + k + ",\"error\":" + Common.str(e.toString()));
                    Thread.sleep(100);  // (not connected: Paho refuses; try again)
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
