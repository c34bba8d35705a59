/*
 * blobsvc's benchmark harness for Apache Flink's own BlobServer and BlobClient (Flink 2.x),
 * driven line by line by benchmarks/bench_flink.py, which compares them with blobsvc in the
 * same run. It is compiled against flink-dist-*.jar at run time; nothing of Flink is copied.
 *
 *   java -cp CLASSES:flink-dist.jar:log4j-*.jar org.apache.flink.runtime.blob.BlobBench serve DIR
 *     Starts a BlobServer on 127.0.0.1, port 0, storing under DIR with a VoidBlobStore (no HA),
 *     prints "listening on 127.0.0.1:PORT", then answers one line per command on stdin:
 *       cpu    -> this JVM's CPU time so far in nanoseconds (every thread, dead ones too:
 *                 the server runs a thread per connection, and a download's ends with it)
 *       clean  -> deletes every blob stored so far, then "cleaned"
 *     and stops the server at the end of stdin.
 *
 *   java -cp ... org.apache.flink.runtime.blob.BlobBench client PORT DIR
 *     One BlobClient connection to 127.0.0.1:PORT, kept for every command, scratch files in DIR.
 *     Each command line is "OP MODE SIZE COUNT SECONDS" (OP put|get, MODE memory|file): up to
 *     COUNT operations on SIZE-byte blobs, stopping after SECONDS (at least one runs). The answer
 *     is one JSON object: {"ops", "seconds" (the operations' own time, summed), "cpu" (this JVM's
 *     CPU time in them, seconds), "latencies_ns"}, or {"error"}.
 *
 * The class sits in Flink's package because the client's put and get methods, and the blob type
 * they take, are package-private in Flink 2.x: Flink's own caches call them from this package.
 * What each operation is:
 *   put memory  BlobClient.putBuffer of a byte[] (a permanent blob of one job)
 *   put file    BlobClient.uploadFile (public) of a file
 *   get memory  BlobClient.getInternal, read into a new byte[] of the blob's size; the stream
 *               checks the blob's SHA-1 and acknowledges at its end, as Flink's caches rely on
 *   get file    BlobClient.downloadFromBlobServer, Flink's cache path: a new connection per
 *               download, written to the file (no fsync: Flink makes none)
 * Every PUT sends new content (a counter in its first 8 bytes), as every PUT of a job's jar
 * would; a GET fetches what the last PUT of its mode and size stored.
 */
package org.apache.flink.runtime.blob;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.BlobServerOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.JobManagerOptions;
import org.apache.flink.core.fs.Path;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.RandomAccessFile;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

public final class BlobBench {

    /** The one job every blob belongs to, so that "clean" can delete them all at once. */
    private static final JobID JOB = new JobID(0x626c6f6273766362L, 1L);

    public static void main(String[] args) throws Exception {
        // Replies go to the real stdout; anything else that prints (logging) goes to stderr.
        PrintStream replies = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        BufferedReader commands =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        if (args.length == 2 && args[0].equals("serve")) {
            serve(new File(args[1]), commands, replies);
        } else if (args.length == 3 && args[0].equals("client")) {
            new Client(Integer.parseInt(args[1]), new File(args[2])).serveCommands(commands, replies);
        } else {
            System.err.println("usage: BlobBench serve DIR | client PORT DIR");
            System.exit(2);
        }
    }

    private static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean)
                        ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    private static void serve(File dir, BufferedReader commands, PrintStream replies)
            throws Exception {
        Configuration config = new Configuration();
        config.set(JobManagerOptions.BIND_HOST, "127.0.0.1");
        config.set(BlobServerOptions.PORT, "0");
        try (BlobServer server = new BlobServer(config, dir, new VoidBlobStore())) {
            server.start();
            replies.println("listening on 127.0.0.1:" + server.getPort());
            for (String line; (line = commands.readLine()) != null; ) {
                if (line.equals("cpu")) {
                    replies.println(cpuNanos());
                } else if (line.equals("clean")) {
                    server.globalCleanupAsync(JOB, Runnable::run).get();
                    replies.println("cleaned");
                } else {
                    replies.println("unknown command " + line);
                }
            }
        }
    }

    private static final class Client {
        private final InetSocketAddress address;
        private final Configuration config = new Configuration();
        private final File dir;
        private final Map<Integer, byte[]> sources = new HashMap<>();
        private final Map<String, BlobKey> stored = new HashMap<>();
        private long puts;

        Client(int port, File dir) {
            this.address = new InetSocketAddress("127.0.0.1", port);
            this.dir = dir;
        }

        void serveCommands(BufferedReader commands, PrintStream replies) throws IOException {
            try (BlobClient client = new BlobClient(address, config)) {
                for (String line; (line = commands.readLine()) != null; ) {
                    try {
                        replies.println(run(client, line.split(" ")));
                    } catch (Exception e) {
                        e.printStackTrace();
                        replies.println("{\"error\": \"" + quote(String.valueOf(e)) + "\"}");
                    }
                }
            }
        }

        private String run(BlobClient client, String[] words) throws Exception {
            String op = words[0], mode = words[1];
            int size = Integer.parseInt(words[2]);
            int count = Integer.parseInt(words[3]);
            long deadline = System.nanoTime() + (long) (Double.parseDouble(words[4]) * 1e9);
            List<Long> latencies = new ArrayList<>();
            long cpu = 0, total = 0;
            for (int i = 0; i < count && (i == 0 || System.nanoTime() < deadline); i++) {
                Runnable timed = prepare(client, op, mode, size);
                long cpuBefore = cpuNanos(), start = System.nanoTime();
                timed.run();
                long took = System.nanoTime() - start;
                cpu += cpuNanos() - cpuBefore;
                total += took;
                latencies.add(took);
            }
            StringBuilder json = new StringBuilder();
            json.append("{\"ops\": ").append(latencies.size());
            json.append(", \"seconds\": ").append(total / 1e9);
            json.append(", \"cpu\": ").append(cpu / 1e9);
            json.append(", \"latencies_ns\": ").append(latencies).append('}');
            return json.toString();
        }

        /** The untimed preparation of one operation; returns the operation itself. */
        private Runnable prepare(BlobClient client, String op, String mode, int size)
                throws IOException {
            String slot = mode + " " + size;
            byte[] source = sources.computeIfAbsent(size, BlobBench::randomBytes);
            File file = new File(dir, "source-" + size);
            File download = new File(dir, "download-" + size);
            long stamp = ++puts;
            if (op.equals("put") && mode.equals("memory")) {
                ByteBuffer.wrap(source).putLong(0, stamp);
                return unchecked(() -> stored.put(slot, client.putBuffer(
                        JOB, source, 0, size, BlobKey.BlobType.PERMANENT_BLOB)));
            }
            if (op.equals("put") && mode.equals("file")) {
                if (file.length() != size) {
                    Files.write(file.toPath(), source);
                }
                try (RandomAccessFile raf = new RandomAccessFile(file, "rw")) {
                    raf.writeLong(stamp);
                }
                Path path = new Path(file.toURI());
                return unchecked(() -> stored.put(slot, client.uploadFile(JOB, path)));
            }
            BlobKey key = stored.get(slot);
            if (key == null) {
                throw new IOException("no " + slot + " blob stored yet to GET");
            }
            if (mode.equals("memory")) {
                return unchecked(() -> {
                    byte[] data = new byte[size];
                    try (InputStream in = client.getInternal(JOB, key)) {
                        if (in.readNBytes(data, 0, size) != size || in.read() != -1) {
                            throw new IOException("the blob is not " + size + " bytes long");
                        }
                    }
                });
            }
            Files.deleteIfExists(download.toPath()); // not timed: freeing the last copy's blocks
            return unchecked(() -> BlobClient.downloadFromBlobServer(
                    JOB, key, download, address, config, 0));
        }
    }

    private interface IOAction {
        void run() throws IOException;
    }

    private static Runnable unchecked(IOAction action) {
        return () -> {
            try {
                action.run();
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        };
    }

    private static byte[] randomBytes(int size) {
        byte[] bytes = new byte[size];
        new Random(size).nextBytes(bytes);
        return bytes;
    }

    private static String quote(String text) {
        return text.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ");
    }
}
