// Paho Java subscriber for the MQTT foreign-client tests (MQTT 3.1.1): subscribes to --topic at
// --qos (with --persistent: clean session 0, subscribing only when the session is not present: the
// subscription is the session's) and reports every message Paho hands over (`msg`: key, topic,
// DUP flag, packet id).
//
// Paho hands a QoS 2 message over when the PUBREL comes, having stored the PUBLISH in its
// persistence and sent PUBREC. With MqttDefaultFilePersistence (the folder --state, by default the
// report's path + ".paho") that state outlives the process: a subscriber started again with the
// same client id and folder gets, on the router's PUBREL, what the last one had accepted. SIGTERM
// runs Paho's disconnect (quiesce: what is being handed over finishes, nothing new is taken,
// then DISCONNECT). Paho reconnects by itself (automatic reconnect, at most 1 s apart; session
// present is not known then: null); with a failover list (--url A,B) Paho's own server URIs
// (MqttConnectOptions.setServerURIs: each connection tries them in order, so a dead first router is
// passed over). Written for these tests; plain Eclipse Paho.
import org.eclipse.paho.client.mqttv3.IMqttDeliveryToken;
import org.eclipse.paho.client.mqttv3.IMqttToken;
import org.eclipse.paho.client.mqttv3.MqttAsyncClient;
import org.eclipse.paho.client.mqttv3.MqttCallbackExtended;
import org.eclipse.paho.client.mqttv3.MqttConnectOptions;
import org.eclipse.paho.client.mqttv3.MqttMessage;
import org.eclipse.paho.client.mqttv3.persist.MqttDefaultFilePersistence;

public final class Subscriber {
    public static void main(String[] argv) throws Exception {
        Common.Args a = new Common.Args(argv);
        Common.Report rep = new Common.Report(a.get("report"));
        String cid = a.get("client-id");
        String topic = a.get("topic");
        int qos = (int) a.num("qos", 2);
        boolean persistent = a.flag("persistent");
        String[] uris = a.uris();
        MqttAsyncClient c = new MqttAsyncClient(uris[0], cid,
                new MqttDefaultFilePersistence(a.get("state", a.get("report") + ".paho")));
        c.setCallback(new MqttCallbackExtended() {
            @Override public void connectComplete(boolean reconnect, String uri) {
                if (reconnect) {
                    rep.line("connected", "\"present\":null,\"reconnect\":true,\"url\":" + Common.str(Common.url(uri)));
                }
            }

            @Override public void connectionLost(Throwable cause) {
                rep.line("disconnected", "\"error\":" + Common.str(String.valueOf(cause)));
            }

            @Override public void messageArrived(String t, MqttMessage m) {
                rep.line("msg", "\"topic\":" + Common.str(t) + ",\"dup\":" + m.isDuplicate() + ",\"mid\":" + m.getId()
                         + ",\"qos\":" + m.getQos() + "," + Common.msgFields(m.getPayload()));
            }

            @Override public void deliveryComplete(IMqttDeliveryToken token) {}
        });
        MqttConnectOptions o = new MqttConnectOptions();
        o.setMqttVersion(MqttConnectOptions.MQTT_VERSION_3_1_1);
        o.setCleanSession(!persistent);
        o.setKeepAliveInterval(10);
        o.setAutomaticReconnect(true);
        o.setMaxReconnectDelay(1000);
        if (uris.length > 1) o.setServerURIs(uris);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            rep.line("stopping", "");
            try {
                c.disconnect(5000).waitForCompletion(8000);
                rep.line("disconnected", "\"error\":null");
            } catch (Exception e) {
                rep.line("error", "\"error\":" + Common.str(e.toString()));
                Runtime.getRuntime().halt(1);
            }
            Runtime.getRuntime().halt(0);  // (stopped as asked: exit status 0, not the JVM's 143)
        }));
        try {
            IMqttToken t = c.connect(o);
            t.waitForCompletion(15000);
            boolean present = t.getSessionPresent();
            rep.line("connected", "\"present\":" + present + ",\"url\":" + Common.str(Common.url(c.getCurrentServerURI())));
            if (!(present && persistent)) {
                IMqttToken s = c.subscribe(topic, qos);
                s.waitForCompletion(15000);
                rep.line("subscribed", "\"granted\":" + java.util.Arrays.toString(s.getGrantedQos()));
            }
        } catch (Exception e) {
            rep.line("error", "\"error\":" + Common.str(e.toString()));
            System.exit(1);
        }
        Thread.currentThread().join();  // (runs until stopped)
    }
}
