// Shared by the Qpid JMS publisher and subscriber of the foreign-client tests: arguments, the
// JSON-lines report, the connection URL (failover list, SASL PLAIN, TLS). Written for these tests;
// plain Qpid JMS (no oncemesh code or extension).
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

final class Common {
    private Common() {}

    static final class Args {
        private final Map<String, String> kv = new HashMap<>();

        Args(String[] argv) {
            for (int i = 0; i < argv.length; i++) {
                String k = argv[i];
                if (!k.startsWith("--")) usage("unexpected argument " + k);
                k = k.substring(2);
                if (k.equals("second") || k.equals("drain") || k.equals("no-client-id")) { kv.put(k, "1"); continue; }
                if (i + 1 >= argv.length) usage("--" + k + " needs a value");
                kv.put(k, argv[++i]);
            }
        }

        String get(String k) {
            String v = kv.get(k);
            if (v == null) usage("--" + k + " is required");
            return v;
        }

        String get(String k, String dflt) { return kv.getOrDefault(k, dflt); }

        long num(String k, long dflt) { return Long.parseLong(get(k, Long.toString(dflt))); }

        boolean flag(String k) { return kv.containsKey(k); }
    }

    static void usage(String why) {
        System.err.println("error: " + why);
        System.exit(2);
    }

    // One JSON object per line, flushed at once: the test reads the file while the client runs,
    // and a killed client must leave every line it wrote.
    static final class Report {
        private final PrintStream out;

        Report(String path) throws IOException {
            out = new PrintStream(new FileOutputStream(path, true), false, StandardCharsets.UTF_8);
        }

        synchronized void line(String ev, String fields) {
            String ts = String.format(java.util.Locale.ROOT, "%.6f", System.currentTimeMillis() / 1000.0);
            out.print("{\"ev\":\"" + ev + "\",\"ts\":" + ts + (fields.isEmpty() ? "" : "," + fields) + "}\n");
            out.flush();
        }
    }

    static String str(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20 || c > 0x7e) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    // Qpid JMS's failover transport over the URL list (it reconnects to the next one, re-creating
    // the connection's sessions, producers and consumers), the client id (the container id), and the
    // TLS trust store for amqps:// (a PKCS12 file with the CA: --truststore, --truststore-password).
    static String url(Args a) {
        StringBuilder u = new StringBuilder("failover:(");
        String[] urls = a.get("url").split(",");
        for (int i = 0; i < urls.length; i++) {
            if (i > 0) u.append(',');
            u.append(urls[i]);
            // transport options go on each URL: idle timeout 2 s (the router's), and TLS trust
            u.append("?amqp.idleTimeout=2000");
            if (a.flag("user")) u.append("&amqp.saslMechanisms=PLAIN");  // (it would prefer SCRAM)
            if (urls[i].startsWith("amqps:") && a.flag("truststore")) {
                u.append("&transport.trustStoreLocation=").append(a.get("truststore"))
                 .append("&transport.trustStorePassword=").append(a.get("truststore-password", "changeit"))
                 .append("&transport.trustStoreType=PKCS12");
            }
        }
        u.append(")?failover.initialReconnectDelay=100&failover.maxReconnectDelay=1000")
         .append("&failover.useReconnectBackOff=false");
        if (!a.flag("no-client-id")) {  // (without one, a shared subscription's name is global)
            u.append("&jms.clientID=").append(a.get("container"));
        }
        if (a.flag("user")) {
            u.append("&jms.username=").append(a.get("user")).append("&jms.password=").append(a.get("password"));
        }
        return u.toString();
    }
}
