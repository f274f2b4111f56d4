// Qpid JMS subscriber for the foreign-client tests: a durable topic subscription named --link
// (Session.createDurableSubscriber: the receiver link is named after the subscription, the
// container id is the client id, the source never expires), reporting every message (its JMS
// message id, the key "<link>:<k>" from the body, JMSRedelivered) as JSON lines (--report); AUTO_ACKNOWLEDGE
// accepts it after the listener returns (receiver-settle-mode first: Qpid JMS cannot ask for
// second). JMS does not expose delivery tags: "tag" is null; an application deduplicates by JMS
// message id. The failover transport reconnects (the next URL of --url) and re-creates the
// subscriber: the same subscription, resumed. With --drain it pulls: prefetch 0 and receiveNoWait()
// (Qpid JMS grants one credit and drains), every 200 ms once nothing came. With --unsubscribe 1 it
// ends the subscription (Session.unsubscribe) instead, and exits. With --shared NAME it is one member
// of the shared durable subscription NAME (--selector: its JMS selector; --no-client-id: global).
import jakarta.jms.Connection;
import jakarta.jms.Message;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import jakarta.jms.TopicSubscriber;
import java.util.concurrent.CountDownLatch;
import org.apache.qpid.jms.JmsConnectionFactory;

public final class Subscriber {
    public static void main(String[] argv) throws Exception {
        Common.Args a = new Common.Args(argv);
        Common.Report rep = new Common.Report(a.get("report"));
        long prefetch = a.flag("drain") ? 0 : a.num("credit", 100);
        JmsConnectionFactory factory = new JmsConnectionFactory(Common.url(a) + "&jms.prefetchPolicy.all=" + prefetch);
        Connection conn = factory.createConnection();
        ((org.apache.qpid.jms.JmsConnection) conn).addConnectionListener(new Publisher.Listener(rep));
        conn.setExceptionListener(e -> rep.line("error", "\"error\":" + Common.str(e.toString())));
        Session session = conn.createSession(false, Session.AUTO_ACKNOWLEDGE);
        if (a.flag("unsubscribe")) {
            // end the durable subscription (Qpid JMS attaches the link name with no source, a lookup,
            // and closes what it finds) and exit
            try {
                session.unsubscribe(a.get("link"));
                rep.line("unsubscribed", "");
            } catch (jakarta.jms.JMSException e) {
                rep.line("error", "\"error\":" + Common.str(e.toString()));
            }
            conn.close();
            return;
        }
        if (a.flag("shared")) {
            // a member of the shared durable subscription --shared (JMS 2.0), with --selector if given:
            // Qpid JMS attaches `name` (or `name|global` without a client id) with the source
            // capability "shared"; every member splits the subscription's messages
            jakarta.jms.MessageConsumer c = session.createSharedDurableConsumer(
                session.createTopic(a.get("topic")), a.get("shared"), a.flag("selector") ? a.get("selector") : null);
            c.setMessageListener((Message m) -> report(rep, m));
            conn.start();
            rep.line("attached", "\"timeout\":null");
            new CountDownLatch(1).await();  // until the test ends the process
        }
        TopicSubscriber sub = session.createDurableSubscriber(session.createTopic(a.get("topic")), a.get("link"));
        if (!a.flag("drain")) {
            sub.setMessageListener((Message m) -> report(rep, m));
            conn.start();
            rep.line("attached", "\"timeout\":null");
            new CountDownLatch(1).await();  // until the test ends the process
        }
        // --drain: a pull consumer (prefetch 0): receiveNoWait() asks for one message and drains
        conn.start();
        rep.line("attached", "\"timeout\":null");
        while (true) {
            Message m = sub.receiveNoWait();
            if (m != null) {
                report(rep, m);
            } else {
                rep.line("drained", "\"credit\":0");
                Thread.sleep(200);
            }
        }
    }

    static void report(Common.Report rep, Message m) {
        try {
            String body = ((TextMessage) m).getText();
            int semi = body.indexOf(';');
            String key = semi < 0 ? body : body.substring(0, semi);
            rep.line("msg", "\"tag\":null,\"id\":" + Common.str(m.getJMSMessageID()) + ",\"key\":" + Common.str(key)
                     + ",\"size\":" + body.length() + ",\"redelivered\":" + m.getJMSRedelivered());
        } catch (jakarta.jms.JMSException e) {
            rep.line("error", "\"error\":" + Common.str(e.toString()));
        }
    }
}
