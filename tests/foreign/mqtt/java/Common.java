// Shared by the Paho Java publisher and subscriber of the MQTT foreign-client tests: arguments, the
// JSON-lines report, the payload's key (tests/foreign/mqtt/common.py says the format). Written for
// these tests; plain Eclipse Paho (org.eclipse.paho.client.mqttv3).
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
                if (k.equals("persistent")) { kv.put(k, "1"); continue; }
                if (i + 1 >= argv.length) usage("--" + k + " needs a value");
                kv.put(k, argv[++i]);
            }
            if (!get("mqtt", "3.1.1").equals("3.1.1")) {
                usage("this client speaks MQTT 3.1.1 only (org.eclipse.paho.client.mqttv3)");
            }
        }

        String get(String k) {
            String v = kv.get(k);
            if (v == null) usage("--" + k + " is required");
            return v;
        }

        String get(String k, String dflt) { return kv.getOrDefault(k, dflt); }

        long num(String k, long dflt) { return Long.parseLong(get(k, Long.toString(dflt))); }

        double real(String k, double dflt) { return Double.parseDouble(get(k, Double.toString(dflt))); }

        boolean flag(String k) { return kv.containsKey(k); }

        // --url HOST:PORT, or a failover list HOST:PORT,HOST:PORT,... (Paho's server URIs)
        String[] uris() {
            String[] urls = get("url").split(",");
            String[] out = new String[urls.length];
            for (int i = 0; i < urls.length; i++) out[i] = "tcp://" + urls[i].trim();
            return out;
        }
    }

    static void usage(String why) {
        System.err.println("error: " + why);
        System.exit(2);
    }

    // One JSON object per line, flushed at once: the test reads the file while the client runs,
    // and a stopped client must leave every line it wrote.
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

    // "HOST:PORT" of a Paho server URI ("tcp://HOST:PORT")
    static String url(String uri) {
        return uri == null ? null : uri.replaceFirst("^tcp://", "");
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

    static byte[] payload(String clientId, long k, int size) {
        StringBuilder b = new StringBuilder(clientId).append(':').append(k).append(';');
        while (b.length() < size) b.append('x');
        return b.toString().getBytes(StandardCharsets.UTF_8);
    }

    // "k":..., "size":..., "hex":... of a message's payload
    static String msgFields(byte[] p) {
        int cut = 0;
        while (cut < p.length && p[cut] != ';') cut++;
        StringBuilder b = new StringBuilder("\"k\":")
            .append(str(new String(p, 0, cut, StandardCharsets.UTF_8))).append(",\"size\":").append(p.length);
        if (p.length <= 512) {
            b.append(",\"hex\":\"");
            for (byte x : p) b.append(String.format("%02x", x & 0xff));
            b.append('"');
        }
        return b.toString();
    }
}
