// Qpid JMS publisher for the foreign-client tests: sends --count persistent TextMessages to the
// topic --topic, at most --window in flight (asynchronous sends with a CompletionListener; window
// 1: plain synchronous send), and reports every send and outcome as JSON lines (--report). The
// failover transport reconnects (the next URL of --url) and sends again what was in flight; JMS
// does not expose delivery tags, so "tag" is null in the report. Body: "<link>:<k>;" + padding.
// --rate caps new messages per second (0: no cap), so that a test can act mid-stream.
import jakarta.jms.CompletionListener;
import jakarta.jms.Connection;
import jakarta.jms.DeliveryMode;
import jakarta.jms.Message;
import jakarta.jms.MessageProducer;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.qpid.jms.JmsConnectionFactory;
import org.apache.qpid.jms.JmsConnectionListener;

public final class Publisher {
    public static void main(String[] argv) throws Exception {
        Common.Args a = new Common.Args(argv);
        Common.Report rep = new Common.Report(a.get("report"));
        String link = a.get("link");
        int count = (int) a.num("count", 100);
        int window = (int) a.num("window", 50);
        int size = (int) a.num("size", 0);
        long rate = a.num("rate", 0);
        JmsConnectionFactory factory = new JmsConnectionFactory(Common.url(a));
        Connection conn = factory.createConnection();
        ((org.apache.qpid.jms.JmsConnection) conn).addConnectionListener(new Listener(rep));
        conn.setExceptionListener(e -> rep.line("error", "\"error\":" + Common.str(e.toString())));
        conn.start();
        Session session = conn.createSession(false, Session.AUTO_ACKNOWLEDGE);
        MessageProducer producer = session.createProducer(session.createTopic(a.get("topic")));
        producer.setDeliveryMode(DeliveryMode.PERSISTENT);
        Semaphore inFlight = new Semaphore(window);
        AtomicInteger outcomes = new AtomicInteger();
        long start = System.nanoTime();  // (the pace counts from the first send, not the JVM's start)
        for (int k = 0; k < count; k++) {
            while (rate > 0 && k >= (System.nanoTime() - start) / 1e9 * rate + 1) Thread.sleep(5);
            StringBuilder body = new StringBuilder(link + ":" + k + ";");
            while (body.length() < size) body.append('x');
            TextMessage m = session.createTextMessage(body.toString());
            m.setIntProperty("k", k);  // (what a subscriber's selector can select on)
            final int kk = k;
            if (window <= 1) {
                rep.line("sent", "\"k\":" + k + ",\"tag\":null,\"resend\":false");
                try {
                    producer.send(m);
                    rep.line("outcome", "\"k\":" + k + ",\"tag\":null,\"outcome\":\"ACCEPTED\",\"id\":" + Common.str(m.getJMSMessageID()));
                } catch (jakarta.jms.JMSException e) {
                    rep.line("outcome", "\"k\":" + k + ",\"tag\":null,\"outcome\":\"REJECTED\",\"error\":" + Common.str(e.toString()));
                }
                outcomes.incrementAndGet();
                continue;
            }
            inFlight.acquire();
            rep.line("sent", "\"k\":" + k + ",\"tag\":null,\"resend\":false");
            producer.send(m, new CompletionListener() {
                @Override public void onCompletion(Message msg) {
                    String id;
                    try { id = msg.getJMSMessageID(); } catch (jakarta.jms.JMSException e) { id = null; }
                    rep.line("outcome", "\"k\":" + kk + ",\"tag\":null,\"outcome\":\"ACCEPTED\",\"id\":" + Common.str(id));
                    outcomes.incrementAndGet();
                    inFlight.release();
                }
                @Override public void onException(Message msg, Exception e) {
                    rep.line("outcome", "\"k\":" + kk + ",\"tag\":null,\"outcome\":\"REJECTED\",\"error\":" + Common.str(e.toString()));
                    outcomes.incrementAndGet();
                    inFlight.release();
                }
            });
        }
        inFlight.acquire(window);  // every completion in
        rep.line("done", "");
        conn.close();
    }

    static final class Listener implements JmsConnectionListener {
        private final Common.Report rep;
        Listener(Common.Report rep) { this.rep = rep; }
        @Override public void onConnectionEstablished(java.net.URI uri) { rep.line("connected", "\"url\":" + Common.str(uri.toString())); }
        @Override public void onConnectionFailure(Throwable e) { rep.line("error", "\"error\":" + Common.str(e.toString())); }
        @Override public void onConnectionInterrupted(java.net.URI uri) { rep.line("disconnected", "\"error\":" + Common.str(uri.toString())); }
        @Override public void onConnectionRestored(java.net.URI uri) { rep.line("connected", "\"url\":" + Common.str(uri.toString()) + ",\"reconnected\":true"); }
        @Override public void onInboundMessage(org.apache.qpid.jms.message.JmsInboundMessageDispatch e) {}
        @Override public void onSessionClosed(Session s, Throwable e) { rep.line("error", "\"error\":" + Common.str("session closed: " + e)); }
        @Override public void onConsumerClosed(jakarta.jms.MessageConsumer c, Throwable e) { rep.line("link_error", "\"error\":" + Common.str(e.toString())); }
        @Override public void onProducerClosed(MessageProducer p, Throwable e) { rep.line("link_error", "\"error\":" + Common.str(e.toString())); }
    }
}
