import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;

/**
 * The JVM baseline of bench/spark_read_throughput.py: the Java client (pulsar-client from Maven
 * Central) reading topics in one loop, one reader per topic in turn, skipping the messages
 * pulsar-lite's readers deliver again, and touching every payload. Prints the seconds of each
 * pass over all topics (the first one includes the JIT compiler's warm-up).
 *
 * <p>java -cp CLASSPATH JvmReaderLoop.java SERVICE_URL MESSAGES_PER_TOPIC PASSES TOPIC...
 */
public class JvmReaderLoop {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        int perTopic = Integer.parseInt(args[1]);
        int passes = Integer.parseInt(args[2]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            for (int pass = 0; pass < passes; pass++) {
                long started = System.nanoTime();
                long bytes = 0;
                for (int t = 3; t < args.length; t++) {
                    Reader<byte[]> reader = client.newReader()
                            .topic(args[t])
                            .startMessageId(MessageId.earliest)
                            .receiverQueueSize(10_000)
                            .create();
                    MessageId last = null;
                    int read = 0;
                    while (read < perTopic) {
                        Message<byte[]> message = reader.readNext(30, TimeUnit.SECONDS);
                        if (message == null) {
                            throw new IllegalStateException("no message in 30 s on " + args[t]);
                        }
                        MessageId id = message.getMessageId();
                        if (last != null && id.compareTo(last) <= 0) {
                            continue; // a redelivery
                        }
                        last = id;
                        bytes += message.getData().length;
                        read++;
                    }
                    reader.close();
                }
                double seconds = (System.nanoTime() - started) / 1e9;
                System.out.println(seconds + " " + bytes);
            }
        }
    }
}
